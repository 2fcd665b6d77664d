"""The ``nvct`` management CLI.

``nvct hook ...`` runs inside container starts, so it is dispatched before
click is imported; everything else is a click group whose subcommands are
imported only when named.
"""

from __future__ import annotations

import sys

#: subcommand name -> "module:attribute" under nvct.cli (a click command).
_SUBCOMMANDS = {
    "info": "info:info_command",
    "list": "info:list_command",
    "cdi": "cdi:cdi_group",
    "config": "config:config_group",
    "runtime": "runtime:runtime_group",
    "system": "system:system_group",
    "toolkit": "toolkit:toolkit_group",
    "simulate": "simulate:simulate_group",
    "doctor": "doctor:doctor_command",
    "explain": "explain:explain_command",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "hook":
        from nvct.hooks import main as hook_main

        return hook_main(argv[1:])
    if argv[:2] == ["cdi", "generate"]:  # the refresh units' command: no click when plain
        from nvct.cli.cdi_generate import fast_main

        rc = fast_main(argv[2:])
        if rc is not None:
            return rc
    return _click_main(argv)


def _click_main(argv: list[str]) -> int:
    import click

    from nvct import __version__
    from nvct.base.errors import NvctError

    class _LazyGroup(click.Group):
        def list_commands(self, ctx):
            return sorted(n for n in _SUBCOMMANDS if _load(n) is not None) + ["hook"]

        def get_command(self, ctx, name):
            if name == "hook":
                return _hook_placeholder
            return _load(name)

    @click.command("hook", context_settings={"ignore_unknown_options": True},
                   help="OCI hooks run inside container starts (update-ldcache, create-symlinks, ...).")
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def _hook_placeholder(args):
        from nvct.hooks import main as hook_main

        raise SystemExit(hook_main(list(args)))

    @click.group(cls=_LazyGroup)
    @click.version_option(__version__, prog_name="nvct")
    @click.option("--config", "config_path", envvar="NVIDIA_CTK_CONFIG_FILE_PATH",
                  help="nvct config file (default: /etc/nvidia-container-runtime/config.toml).")
    @click.option("--debug", is_flag=True, help="Log every file read and decision made.")
    @click.pass_context
    def cli(ctx, config_path, debug):
        ctx.ensure_object(dict)
        ctx.obj["config_path"] = config_path
        ctx.obj["debug"] = debug
        if debug:
            from nvct.base import log

            log.setup(level="debug", stderr=True)

    try:
        cli.main(args=argv, prog_name="nvct", standalone_mode=False)
    except NvctError as e:
        click.echo(f"nvct: {e}", err=True)
        return 1
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _load(name: str):
    target = _SUBCOMMANDS.get(name)
    if target is None:
        return None
    import importlib  # not at the top: it imports warnings, and `nvct hook` runs on every container start

    module, attr = target.split(":")
    try:
        mod = importlib.import_module(f"nvct.cli.{module}")
    except ModuleNotFoundError as e:
        if e.name == f"nvct.cli.{module}":
            return None
        raise
    return getattr(mod, attr)


def load_config(ctx):
    """The config for a subcommand, from ``--config`` or the usual lookup."""
    from nvct.config import file as config

    obj = ctx.find_root().obj or {}
    return config.load(obj.get("config_path"))
