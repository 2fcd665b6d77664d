"""``nvct cdi``: generate, list and transform CDI specs (like ``nvidia-ctk cdi``)."""

from __future__ import annotations

import sys

import click

from nvct.cli import load_config


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
    from nvct.cdi import encoding, generate, spec as spec_mod
    from nvct.driver import Driver
    from nvct.errors import NvctError
    from nvct.injection import hook_executable

    config = load_config(ctx)
    fmt = _output_format(fmt, output)
    if hook_path is not None and not hook_path.startswith("/"):
        raise NvctError(f"--hook-path: {hook_path!r} is not an absolute path")
    if dev_root is None:
        dev_root = driver_root if driver_root is not None else config.dev_root
    driver = Driver(driver_root or config.driver_root, dev_root or "/", config.proc_root,
                    config.get("nvidia-container-cli.ldcache") or None)
    raw = generate.generate(
        driver, hook_path=hook_path or hook_executable(config), vendor=vendor, cls=cls,
        device_ids=_split(device_ids) or ("all",), strategies=strategies or generate.DEFAULT_STRATEGIES,
        mode=mode.lower(), all_device=not no_all_device)
    if not output:
        sys.stdout.write(encoding.dumps(raw, fmt))
        return
    written = spec_mod.save(raw, output, fmt)
    click.echo(f"nvct: wrote {written} (cdiVersion {raw['cdiVersion']}, "
               f"{len(raw['devices'])} devices)", err=True)


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
    fmt = _output_format(fmt, output, default=encoding.format_for(input_path) or "yaml")
    if not output:
        sys.stdout.write(encoding.dumps(raw, fmt))
        return
    spec_mod.save(raw, output, fmt)


def _split(values) -> tuple[str, ...]:
    """Repeated options that may also hold comma-separated lists (``--device-id 0,1``)."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def _output_format(fmt: str | None, output: str, default: str = "yaml") -> str:
    from nvct.cdi.encoding import format_for
    from nvct.errors import NvctError

    implied = format_for(output) if output else None
    if fmt and implied and fmt.lower() != implied:
        raise NvctError(f"--format {fmt} does not match --output {output}")
    return (fmt or implied or default).lower()
