"""``nvct config``: print, edit and generate nvct's config.toml, like ``nvidia-ctk config``.

* ``nvct config default`` -- the defaults, with the settings operators usually
  change shown as commented example lines (the reference's layout);
* ``nvct config show`` -- the effective config (file over defaults);
* ``nvct config [--set key=value]... [-i | -o FILE]`` -- edit: an existing file
  keeps its comments and layout; a missing one starts from ``config default``.

``--set`` types values by the key's default: booleans (``key`` alone is
``key=true``), integers, lists (split on ``:``, else ``,``), strings. Unknown
keys are an error, as in the reference; ``features.<name>=nil`` removes a feature.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import click

from nvct.base.errors import ConfigError
from nvct.base.fileutil import write_atomic
from nvct.config.render import FEATURES, render
from nvct.engines.document import TomlDocument
from nvct.engines.engine import read_file

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
_DELETE = object()


@click.group("config", invoke_without_command=True,
             help="Print or edit nvct's config.toml (--set key=value, -i to edit in place).")
@click.option("--config-file", "--config", "-c", "config_file", metavar="PATH",
              help="The config file (default: nvct --config, $NVIDIA_CTK_CONFIG_FILE_PATH, "
                   "/etc/nvidia-container-runtime/config.toml).")
@click.option("--set", "sets", multiple=True, metavar="KEY[=VALUE]",
              help="Set a dotted key; repeatable, the last one for a key wins; lists split on ':' or ','.")
@click.option("--set-list-separator", default=":", hidden=True)
@click.option("--in-place", "-i", is_flag=True, help="Write the result back to the config file.")
@click.option("--output", "-o", metavar="PATH", help="Write the result here instead of stdout.")
@click.pass_context
def config_group(ctx, config_file, sets, set_list_separator, in_place, output) -> None:
    ctx.ensure_object(dict)
    ctx.obj["config_file"] = config_file
    if ctx.invoked_subcommand is not None:
        return
    if in_place and output:
        raise ConfigError("cannot use both --in-place and --output")
    if not set_list_separator:
        raise ConfigError("--set-list-separator must not be empty")
    path = _config_path(ctx, config_file)
    text = edit(path, [parse_set(s, set_list_separator) for s in sets])
    if in_place:
        _write(path, text, backup=True)
    elif output:
        _write(output, text, backup=False)
    else:
        click.echo(text, nl=False)


@config_group.command("default", help="Print the default config.toml.")
@click.option("--output", "-o", metavar="PATH", help="Write it here instead of stdout.")
def default_command(output) -> None:
    text = render(_defaults(), explicit=set())
    if output:
        _write(output, text, backup=False)
    else:
        click.echo(text, nl=False)


for _alias in ("create-default", "generate-default"):  # the reference's other names for it
    _hidden = copy.copy(default_command)
    _hidden.hidden = True
    config_group.add_command(_hidden, _alias)


@config_group.command("show", help="Print the effective config: the file over the defaults.")
@click.option("--config-file", "--config", "-c", "config_file", metavar="PATH", help="The config file.")
@click.pass_context
def show_command(ctx, config_file) -> None:
    from nvct.config import file as config

    path = config_file or ctx.obj.get("config_file") or (ctx.find_root().obj or {}).get("config_path")
    loaded = config.load(path)
    warn_unknown_keys(loaded)
    click.echo(render(loaded.data, explicit=None), nl=False)


# --------------------------------------------------------------------------- editing


def edit(path: str, sets: list) -> str:
    """The config at ``path`` with ``sets`` applied, checked, as TOML text."""
    from nvct.config.file import Config, parse_toml

    raw = read_file(path)
    if raw is None:
        data = _defaults()
        for key, value in sets:
            _set_plain(data, key, value)
        text = render(data, explicit={".".join(k) for k, _ in sets})
    else:
        doc = TomlDocument(path, raw)
        for key, value in sets:
            if value is _DELETE:
                doc.delete(key)
            else:
                doc.set(key, value)
        text = (doc.render() or b"").decode("utf-8")
    warn_unknown_keys(Config(parse_toml(text.encode("utf-8"), path), path))
    return text


def warn_unknown_keys(config) -> None:
    """Typos in key names go to stderr; the config is still used (newer reference keys must work)."""
    line = config.unknown_keys_warning()
    if line:
        click.echo(f"nvct: warning: {line}", err=True)


def parse_set(flag: str, list_separator: str = ":") -> tuple:
    """``key[=value]`` -> (key parts, typed value); value typed by the key's default."""
    key, eq, value = flag.partition("=")
    default = _default_for(key, flag)
    if not eq:
        if isinstance(default, bool):
            return tuple(key.split(".")), True
        raise ConfigError(f"--set {flag}: expected key=value")
    if key.startswith("features.") and value == "nil":
        return tuple(key.split(".")), _DELETE
    if isinstance(default, bool):
        if value in _TRUE:
            return tuple(key.split(".")), True
        if value in _FALSE:
            return tuple(key.split(".")), False
        raise ConfigError(f"--set {flag}: {value!r} is not a boolean")
    if isinstance(default, int):
        try:
            return tuple(key.split(".")), int(value, 10)
        except ValueError:
            raise ConfigError(f"--set {flag}: {value!r} is not an integer") from None
    if isinstance(default, list):
        for sep in (list_separator, ","):
            if sep in value:
                return tuple(key.split(".")), value.split(sep)
        return tuple(key.split(".")), [value]
    return tuple(key.split(".")), value


def _default_for(key: str, flag: str) -> Any:
    from nvct.config.file import DEFAULTS

    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "features":
        if parts[1] in FEATURES:
            return False
        raise ConfigError(f"--set {flag}: unknown feature {parts[1]!r}")
    node: Any = DEFAULTS
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"--set {flag}: unknown config key {'.'.join(parts[: i + 1])!r}")
        node = node[part]
    if isinstance(node, dict):
        raise ConfigError(f"--set {flag}: {key!r} is a table, not a setting")
    return node


def _set_plain(data: dict, key: tuple, value: Any) -> None:
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(key[-1], None)
    else:
        node[key[-1]] = value


def _defaults() -> dict:
    from nvct.config.file import DEFAULTS

    return copy.deepcopy(DEFAULTS)


def _config_path(ctx, config_file: str | None) -> str:
    from nvct.config import file as config

    return config_file or (ctx.find_root().obj or {}).get("config_path") or config.default_path()


def _write(path: str, text: str, *, backup: bool) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
        write_atomic(path, text, backup=path + ".nvct.bak" if backup else None)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e.strerror or e}") from None
