"""``nvct info`` and ``nvct list``: what the driver offers (like ``nvidia-container-cli info/list``)."""

from __future__ import annotations

import json

import click

from nvct.cli import load_config


def _driver(ctx):
    from nvct.discover.driver import Driver

    return Driver.from_config(load_config(ctx))


def _json_or(data, as_json: bool) -> bool:
    """Print ``data`` as JSON when asked; True when done."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
    return as_json


@click.command("info", help="Driver version, CUDA version and GPUs (with MIG devices).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def info_command(ctx, as_json):
    from nvct.discover import inventory

    data = inventory.info(_driver(ctx))
    if _json_or(data, as_json):
        return
    click.echo(f"NVRM version:   {data['driver_version']}")
    click.echo(f"CUDA version:   {data['cuda_version'] or 'unknown (' + str(data['nvml']) + ')'}")
    for gpu in data["gpus"]:
        click.echo("")
        click.echo(f"Device Index:   {gpu['index']}")
        click.echo(f"Device Minor:   {gpu['minor']}")
        click.echo(f"Model:          {gpu['model']}")
        click.echo(f"GPU UUID:       {gpu['uuid']}")
        click.echo(f"Bus Location:   {gpu['bus_id']}")
        click.echo(f"MIG:            {'enabled' if gpu['mig_enabled'] else 'disabled'}")
        for mig in gpu["mig_devices"]:
            click.echo(f"  MIG {mig['name']}:  GI {mig['gi']} CI {mig['ci']}  {mig['uuid'] or ''}".rstrip())


@click.command("list", help="Device nodes, libraries, binaries, IPC sockets and firmware of the driver.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_command(ctx, as_json):
    from nvct.discover import inventory

    data = inventory.listing(_driver(ctx))
    if _json_or(data, as_json):
        return
    for node in data["device_nodes"]:
        click.echo(node["path"])
    for lib in data["libraries"]:
        click.echo(lib["path"])
    for item in data["binaries"]:
        click.echo(item["path"])
    for path in data["ipc"] + data["firmware"]:
        click.echo(path)
