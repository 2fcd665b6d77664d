"""``nvct cdi``: generate, list and transform CDI specs (like ``nvidia-ctk cdi``)."""

from __future__ import annotations

import sys

import click

from nvct.base.errors import SpecError
from nvct.cli import load_config
from nvct.cli.cdi_generate import DEPRECATED_ENV, FLAG, LIST, OPTIONS, output_format, run


@click.group("cdi", help="Container Device Interface specs: generate, list, transform.")
def cdi_group():
    pass


def _generate_options(command):
    """The click options of ``cdi generate``, from its one table (:data:`nvct.cli.cdi_generate.OPTIONS`)."""
    for opt in reversed(OPTIONS):
        env = opt.env + tuple(old for old, new in DEPRECATED_ENV.items() if new in opt.env)
        kwargs: dict[str, object] = {"default": None, "help": f"{opt.help} [env: {', '.join(env)}]"}
        if opt.kind == FLAG:
            kwargs["is_flag"] = True
        else:
            kwargs["multiple"] = opt.kind == LIST
            kwargs["metavar"] = opt.metavar
            if opt.choices:
                kwargs["type"] = click.Choice(opt.choices, case_sensitive=False)
        command = click.option(*opt.names, opt.param, **kwargs)(command)
    return command


@cdi_group.command("generate", help="Write a CDI spec for this node's GPUs and MIG devices, or for a "
                   "subsystem (--mode).", context_settings={"max_content_width": 140})
@_generate_options
@click.pass_context
def generate_command(ctx, **params):
    given = {k: (list(v) if isinstance(v, tuple) else v) for k, v in params.items() if v not in (None, ())}
    message = run(load_config(ctx), given)
    if message:
        click.echo(message, err=True)


@cdi_group.command("list", help="List the CDI devices the spec directories define.")
@click.option("--spec-dir", "spec_dirs", multiple=True, metavar="DIR",
              help="Directories to read, in increasing priority (default: the config's spec-dirs).")
@click.pass_context
def list_command(ctx, spec_dirs):
    from nvct.cdi.registry import Registry

    dirs = spec_dirs or load_config(ctx).cdi_spec_dirs or ()
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

