"""``nvct system``: node setup, as ``nvidia-ctk system`` (see :mod:`nvct.node.devices`).

Both commands take the device and proc roots from nvct's config (``[nvct]
dev-root``, ``proc-root``), so they work on a simulated node as on a host.
"""

from __future__ import annotations

import os

import click

from nvct.base.errors import NvctError
from nvct.cli import load_config


def _load_modules(config, dev_root: str, dry_run: bool) -> None:
    """``--load-kernel-modules``: nvct.node.kmods, as the hook's load-kmods (only for this kernel's /proc)."""
    if dry_run:
        _warn("--load-kernel-modules: not loading anything (--dry-run)")
    elif os.path.normpath(config.proc_root) != "/proc":
        _warn(f"--load-kernel-modules: {config.proc_root} is not this kernel's /proc: nothing loaded")
    else:
        from nvct.node import kmods

        for problem in kmods.load(config.proc_root, dev_root):
            _warn(problem)


@click.group("system", help="Set up a GPU node: device nodes and /dev/char links.")
def system_group() -> None:
    pass


@system_group.command("create-device-nodes", help="Create the NVIDIA control device nodes that are missing.")
@click.option("--control-devices", is_flag=True,
              help="Create nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools and the MIG "
                   "config/monitor capability nodes.")
@click.option("--dev-root", metavar="DIR", envvar=["NVIDIA_DEV_ROOT", "DEV_ROOT"],
              help="Where /dev is (default: --root, else the config's nvct.dev-root).")
@click.option("--root", "--driver-root", "root", metavar="DIR",
              help="The driver root; the default dev root when --dev-root is not given (the reference's rule).")
@click.option("--load-kernel-modules", is_flag=True,
              help="Load nvidia, nvidia_uvm, nvidia_modeset first (modprobe; this kernel's /proc only).")
@click.option("--dry-run", is_flag=True, envvar="DRY_RUN", help="Print what would be created; change nothing.")
@click.pass_context
def create_device_nodes_command(ctx, control_devices, dev_root, root, load_kernel_modules, dry_run) -> None:
    from nvct.node import devices as system

    config = load_config(ctx)
    if load_kernel_modules:
        _load_modules(config, dev_root or root or config.dev_root, dry_run)
    if not control_devices:
        _warn("nothing to do: pass --control-devices to create the control device nodes")
        return
    dev_root = dev_root or root or config.dev_root
    nodes = system.control_nodes(config.proc_root)
    for name in system.missing_modules(config.proc_root):
        _warn(f"{config.proc_root}/devices: no {name} device (module not loaded): its nodes are skipped")
    _report(system.create_device_nodes(nodes, dev_root, dry_run=dry_run))


@system_group.command("create-dev-char-symlinks",
                      help="Create /dev/char/MAJOR:MINOR links to the NVIDIA device nodes.")
@click.option("--dev-char-path", metavar="DIR", envvar="DEV_CHAR_PATH",
              help="Where the links go (default: <dev-root>/dev/char; the host's /dev/char when no dev root is set).")
@click.option("--dev-root", metavar="DIR", envvar=["NVIDIA_DEV_ROOT", "DEV_ROOT"],
              help="Where /dev is (default: the config's nvct.dev-root, else the driver root).")
@click.option("--create-all", is_flag=True, envvar="CREATE_ALL",
              help="Link every node the loaded driver can have, not only the existing ones.")
@click.option("--create-device-nodes", is_flag=True, envvar="CREATE_DEVICE_NODES",
              help="With --create-all: first create the missing control device nodes.")
@click.option("--load-kernel-modules", is_flag=True,
              help="Load nvidia, nvidia_uvm, nvidia_modeset first (modprobe; this kernel's /proc only).")
@click.option("--dry-run", is_flag=True, envvar="DRY_RUN", help="Print what would be linked; change nothing.")
@click.pass_context
def create_dev_char_symlinks_command(ctx, dev_char_path, dev_root, create_all, create_device_nodes,
                                     load_kernel_modules, dry_run) -> None:
    from nvct.node import devices as system

    config = load_config(ctx)
    dev_char_path = dev_char_path or os.path.join(dev_root or config.dev_char_root, "dev/char")
    dev_root = dev_root or config.dev_root
    if load_kernel_modules:
        _load_modules(config, dev_root, dry_run)
    actions = []
    if create_device_nodes:
        if create_all:
            actions += system.create_device_nodes(system.control_nodes(config.proc_root), dev_root,
                                                  dry_run=dry_run)
        else:
            _warn("--create-device-nodes applies only with --create-all: ignored")
    nodes = system.all_possible_nodes(config.proc_root) if create_all else system.existing_nodes(dev_root)
    if not nodes:
        _warn(f"no NVIDIA device nodes under {dev_root.rstrip('/')}/dev: nothing to link")
    actions += system.create_dev_char_links(nodes, dev_root, dev_char_path, dry_run=dry_run)
    _report(actions)


def _report(actions) -> None:
    for action in actions:
        click.echo(str(action))
    problems = [a for a in actions if a.problem]
    if problems:
        raise NvctError(f"{len(problems)} path(s) in the way (see above): nothing was replaced")


def _warn(message: str) -> None:
    click.echo(f"nvct: warning: {message}", err=True)
