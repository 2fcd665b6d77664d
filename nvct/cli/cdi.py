"""``nvct cdi``: generate, list and transform CDI specs (like ``nvidia-ctk cdi``)."""

from __future__ import annotations

import sys

import click

from nvct.cli import load_config
from nvct.cli.cdi_generate import output_format


@click.group("cdi", help="Container Device Interface specs: generate, list, transform.")
def cdi_group():
    pass


@cdi_group.command("generate", help="Write a CDI spec for this node's GPUs and MIG devices.")
@click.option("--output", "output", default="", metavar="FILE", envvar="NVIDIA_CTK_CDI_OUTPUT_FILE_PATH",
              help="Write here (atomically) instead of to stdout; a name without .yaml/.json gets one.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"], case_sensitive=False), default=None,
              envvar="NVIDIA_CTK_CDI_OUTPUT_FORMAT",
              help="Output format (default: from the --output extension, else yaml).")
@click.option("--mode", "--discovery-mode", "mode", default="auto", show_default=True,
              type=click.Choice(["auto", "nvml", "management"], case_sensitive=False),
              help="management: one 'all' device with every NVIDIA device node, for monitoring.")
@click.option("--device-name-strategy", "strategies", multiple=True,
              type=click.Choice(["index", "uuid", "type-index"]),
              help="How devices are named; repeat for several names each (default: index and uuid).")
@click.option("--device-id", "--device-ids", "device_ids", multiple=True, metavar="ID",
              help="Only these GPUs/MIG devices (index, GPU:MIG, UUID, PCI bus id, all, none); repeatable.")
@click.option("--driver-root", default=None, metavar="DIR",
              help="Where the driver's files are (default: the config's nvidia-container-cli.root).")
@click.option("--dev-root", default=None, metavar="DIR",
              help="Where /dev is (default: the config's, or --driver-root when that is given).")
@click.option("--vendor", "--cdi-vendor", "vendor", default="nvidia.com", show_default=True)
@click.option("--class", "--cdi-class", "cls", default="gpu", show_default=True)
@click.option("--no-all-device", is_flag=True, help="Do not add the 'all' device.")
@click.option("--hook-path", "--nvidia-cdi-hook-path", "hook_path", default=None, metavar="PATH",
              help="Absolute path of nvct for the createContainer hook (default: this nvct).")
@click.pass_context
def generate_command(ctx, output, fmt, mode, strategies, device_ids, driver_root, dev_root, vendor, cls,
                     no_all_device, hook_path):
    from nvct.cli.cdi_generate import run

    message = run(load_config(ctx), output=output, fmt=fmt, mode=mode, strategies=strategies,
                  device_ids=device_ids, driver_root=driver_root, dev_root=dev_root, vendor=vendor,
                  cls=cls, no_all_device=no_all_device, hook_path=hook_path)
    if message:
        click.echo(message, err=True)


@cdi_group.command("list", help="List the CDI devices the spec directories define.")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR",
              help="Directories to read, in increasing priority (default: the config's spec-dirs).")
@click.pass_context
def list_command(ctx, spec_dirs):
    from nvct.cdi.registry import Registry

    dirs = spec_dirs or load_config(ctx).get("nvidia-container-runtime.modes.cdi.spec-dirs") or ()
    registry = Registry(dirs)
    for problem in registry.problems():
        click.echo(f"nvct: warning: {problem}", err=True)
    for name in registry.device_names():
        click.echo(name)


@cdi_group.group("transform", help="Rewrite a CDI spec.")
def transform_group():
    pass


@transform_group.command("root", help="Move the spec's paths from one root to another.")
@click.option("--from", "from_root", required=True, metavar="DIR", help="The root to replace.")
@click.option("--to", "to_root", default="/", show_default=True, metavar="DIR", help="The new root.")
@click.option("--relative-to", type=click.Choice(["host", "container"]), default="host", show_default=True,
              help="Move host-side paths (host) or container-side paths (container).")
@click.option("--input", "input_path", default="-", show_default=True, metavar="FILE",
              help="The spec to read ('-': stdin).")
@click.option("--output", "output", default="", metavar="FILE", help="Write here instead of to stdout.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"], case_sensitive=False), default=None,
              help="Output format (default: from --output's, else --input's extension, else yaml).")
def transform_root_command(from_root, to_root, relative_to, input_path, output, fmt):
    from nvct.cdi import encoding, schema, spec as spec_mod, version
    from nvct.cdi.transform import transform_root
    from nvct.errors import SpecError

    if input_path == "-":
        spec = spec_mod.parse(sys.stdin.buffer.read(), "<stdin>")
    else:
        spec = spec_mod.read(input_path)
    raw = spec.raw
    transform_root(raw, from_root, to_root, relative_to)
    try:
        raw["cdiVersion"] = version.newest(spec.version, schema.minimum_version(raw))
        spec_mod.validate(raw, spec.path)
    except schema.Invalid as e:
        raise SpecError(f"{spec.path}: transformed spec is invalid: {e}") from None
    fmt = output_format(fmt, output, default=encoding.format_for(input_path) or "yaml")
    if not output:
        sys.stdout.write(encoding.dumps(raw, fmt))
        return
    spec_mod.save(raw, output, fmt)

