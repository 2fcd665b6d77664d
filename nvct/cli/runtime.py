"""``nvct runtime configure|unconfigure``: the reference's ``nvidia-ctk runtime configure``.

Thin: flags are checked and defaulted as the reference does, then handed to
:mod:`nvct.engines`, which does (and documents) the work.
"""

from __future__ import annotations

import os

import click

from nvct import engines as runtimes
from nvct.base.errors import ConfigError
from nvct.engines import DEFAULT

_ENGINES = ("docker", "containerd", "crio")
_RUNTIME_BINARY = "nvidia-container-runtime"
_RUNTIME_BINARY_PATH = "/usr/bin/nvidia-container-runtime"
_HOOK_MODES = ("oci-hook", "hook")
_FILE_MODES = ("", "config-file", "config")
_RESTART_HINT = {
    "docker": "reload dockerd (SIGHUP) or restart it to apply",
    # dockerd keeps runtimes and its default runtime across a SIGHUP: only a restart drops them.
    "docker-unconfigure": "restart dockerd to apply (a reload keeps the removed runtime and default runtime)",
    "containerd": "restart containerd to apply",
    "crio": "restart cri-o to apply",
}


def _note(message: str) -> None:
    click.echo(f"nvct: {message}", err=True)


def _common(f):
    options = [
        click.option("--runtime", "engine", type=click.Choice(_ENGINES), default="docker", show_default=True,
                     help="The container engine whose config to edit."),
        click.option("--config", "config_path", metavar="PATH",
                     help="The engine's config file (default: /etc/docker/daemon.json, "
                          "/etc/containerd/config.toml, /etc/crio/crio.conf)."),
        click.option("--drop-in-config", "drop_in", metavar="PATH", default=None,
                     help="Write the NVIDIA settings to this drop-in file instead of the main config "
                          "(default, beside --config: containerd conf.d/99-nvidia.toml, cri-o "
                          "crio.conf.d/99-nvidia.toml; '' edits the main config)."),
        click.option("--config-mode", "mode", default="", metavar="MODE",
                     help="config-file (default), or oci-hook to write an OCI hooks.d file instead (deprecated)."),
        click.option("--oci-hook-path", metavar="PATH",
                     help="The hooks.d file for --config-mode=oci-hook (default: print it)."),
        click.option("--dry-run", is_flag=True, help="Print a unified diff of the changes; write nothing."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group("runtime", help="Configure container engines to use the NVIDIA runtime.")
def runtime_group() -> None:
    pass


@runtime_group.command("configure", help="Add the NVIDIA runtime to a container engine's config.")
@_common
@click.option("--nvidia-runtime-name", "name", default="nvidia", show_default=True,
              help="The name the runtime is added under.")
@click.option("--nvidia-runtime-path", "--runtime-path", "runtime_path", default=_RUNTIME_BINARY,
              show_default=True, help="The NVIDIA runtime binary (absolute for containerd and cri-o; "
                                      "the default becomes /usr/bin/nvidia-container-runtime there).")
@click.option("--nvidia-runtime-hook-path", "hook_binary", default="/usr/bin/nvidia-container-runtime-hook",
              show_default=True, help="The hook binary, for --config-mode=oci-hook.")
@click.option("--nvidia-set-as-default", "--set-as-default", "set_as_default", is_flag=True,
              help="Make the NVIDIA runtime the engine's default runtime.")
@click.option("--cdi.enabled", "--cdi.enable", "--enable-cdi", "cdi", is_flag=True,
              help="Enable CDI in the engine (docker: features.cdi; containerd: enable_cdi).")
@click.option("--config-source", type=click.Choice(["file", "command"]), default="file", show_default=True,
              help="Read the current config from the file, or from the daemon (containerd config dump, "
                   "crio status config), falling back to the file.")
@click.option("--executable-path", metavar="PATH",
              help="The engine's binary for --config-source=command.")
def configure_command(engine, config_path, drop_in, mode, oci_hook_path, dry_run, name, runtime_path,
                      hook_binary, set_as_default, cdi, config_source, executable_path) -> None:
    if _hook_mode(mode):
        if oci_hook_path is None:
            click.echo(runtimes.hook_json(hook_binary), nl=False)
            return
        _finish(runtimes.configure_hook(_absolute(oci_hook_path, "--oci-hook-path"), hook_binary,
                                        dry_run=dry_run), "oci-hook", dry_run)
        return
    if engine in ("containerd", "crio"):
        if runtime_path == _RUNTIME_BINARY:
            runtime_path = _RUNTIME_BINARY_PATH
        _absolute(runtime_path, "the NVIDIA runtime path")
    if engine == "docker":
        if executable_path:
            _note(f"ignoring --executable-path for {engine}")
        if config_source == "command":
            _note("docker cannot report its config: reading the file")
            config_source = "file"
    if cdi and engine == "crio":
        _note("ignoring --cdi.enabled for crio (cri-o enables CDI by itself)")
        cdi = False
    change = runtimes.configure(
        engine, config_path, {name: runtime_path}, set_default=name if set_as_default else None, cdi=cdi,
        drop_in=_drop_in(drop_in), config_source=config_source, executable=executable_path, dry_run=dry_run)
    _finish(change, engine, dry_run)


@runtime_group.command("unconfigure", help="Undo what 'runtime configure' did to a container engine's config.")
@_common
@click.option("--nvidia-runtime-name", "names", multiple=True, default=("nvidia",), show_default=True,
              help="Runtimes to remove when there is no nvct undo record (repeatable).")
def unconfigure_command(engine, config_path, drop_in, mode, oci_hook_path, dry_run, names) -> None:
    if _hook_mode(mode):
        if oci_hook_path is None:
            raise ConfigError("--config-mode=oci-hook needs --oci-hook-path to know which file to remove")
        _finish(runtimes.unconfigure_hook(_absolute(oci_hook_path, "--oci-hook-path"), dry_run=dry_run),
                "oci-hook", dry_run)
        return
    change = runtimes.unconfigure(engine, config_path, names, drop_in=_drop_in(drop_in), dry_run=dry_run)
    _finish(change, f"{engine}-unconfigure" if engine == "docker" else engine, dry_run)


def _hook_mode(mode: str) -> bool:
    if mode in _HOOK_MODES:
        _note(f"the {mode!r} config mode is deprecated")
        return True
    if mode not in _FILE_MODES:
        _note(f"ignoring unsupported config mode {mode!r}")
    return False


def _drop_in(value: str | None):
    return DEFAULT if value is None else value


def _absolute(path: str, what: str) -> str:
    if not os.path.isabs(path):
        raise ConfigError(f"{path}: {what} must be an absolute path")
    return path


def _finish(change, engine: str, dry_run: bool) -> None:
    for note in change.notes:
        _note(note)
    if dry_run:
        click.echo(change.diff(), nl=False)
        if not change.changed:
            _note("no changes")
        return
    if not change.changed:
        _note("no changes now" if change.action == "unconfigure" and change.notes
              else "no changes: the config is already as requested")
        return
    for path in change.written:
        _note(f"{'removed' if not os.path.exists(path) else 'wrote'} {path}")
    if engine in _RESTART_HINT:
        _note(_RESTART_HINT[engine])
