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
import re
from typing import Any

import click

from nvct.errors import ConfigError

#: Feature flags the reference knows (``[features]``, each a boolean).
FEATURES = (
    "allow-cuda-compat-libs-from-container",
    "allow-ldconfig-from-container",
    "allow-unknown-oci-spec-fields",
    "disable-cuda-compat-lib-hook",
    "disable-imex-channel-creation",
    "ignore-imex-channel-requests",
    "no-additional-gids-for-device-nodes",
)

#: Settings written commented out, with an example value, unless set (the reference's list).
EXAMPLES = {
    "accept-nvidia-visible-devices-as-volume-mounts": False,
    "accept-nvidia-visible-devices-envvar-when-unprivileged": True,
    "swarm-resource": "DOCKER_RESOURCE_GPU",
    "nvidia-container-cli.debug": "/var/log/nvidia-container-toolkit.log",
    "nvidia-container-cli.ldcache": "/etc/ld.so.cache",
    "nvidia-container-cli.no-cgroups": False,
    "nvidia-container-cli.path": "/usr/bin/nvidia-container-cli",
    "nvidia-container-cli.root": "/run/nvidia/driver",
    "nvidia-container-cli.user": "root:video",
    "nvidia-container-runtime.debug": "/var/log/nvidia-container-runtime.log",
    "nvct.dev-root": "/",
    "nvct.proc-root": "/proc",
    "nvct.path": "/usr/bin/nvct",
}

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
    from nvct import config

    path = config_file or ctx.obj.get("config_file") or (ctx.find_root().obj or {}).get("config_path")
    loaded = config.load(path)
    warn_unknown_keys(loaded)
    click.echo(render(loaded.data, explicit=None), nl=False)


# --------------------------------------------------------------------------- editing


def edit(path: str, sets: list) -> str:
    """The config at ``path`` with ``sets`` applied, checked, as TOML text."""
    from nvct.config import Config, parse_toml
    from nvct.runtimes.document import TomlDocument
    from nvct.runtimes.engine import read_file

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
        text = doc.render().decode("utf-8")
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
    from nvct.config import DEFAULTS

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
    from nvct.config import DEFAULTS

    return copy.deepcopy(DEFAULTS)


def _config_path(ctx, config_file: str | None) -> str:
    from nvct import config

    return config_file or (ctx.find_root().obj or {}).get("config_path") or config.default_path()


def _write(path: str, text: str, *, backup: bool) -> None:
    from nvct.fileutil import write_atomic

    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
        write_atomic(path, text, backup=path + ".nvct.bak" if backup else None)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write: {e.strerror or e}") from None


# --------------------------------------------------------------------------- rendering


def render(data: dict, explicit: set | None) -> str:
    """TOML in the reference's layout: sorted keys, keys before sub-tables.

    With ``explicit`` (the keys the user set), settings in :data:`EXAMPLES` that
    are unset, empty or equal to the example are written as ``#key = example``.
    ``explicit=None`` writes every value as it is.
    """
    lines: list = []
    _render_table(data, (), explicit, lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _render_table(table: dict, prefix: tuple, explicit: set | None, lines: list) -> None:
    scalars = [k for k, v in table.items() if not isinstance(v, dict)]
    tables = sorted(k for k, v in table.items() if isinstance(v, dict))
    body = []
    for name in sorted(set(scalars) | set(_commented_keys(prefix, explicit))):
        dotted = ".".join(prefix + (name,))
        value = table.get(name)
        if explicit is not None and dotted in EXAMPLES and dotted not in explicit and \
                _should_comment(dotted, value):
            body.append(f"#{_key(name)} = {_value(EXAMPLES[dotted])}")
        else:
            body.append(f"{_key(name)} = {_value(value)}")
    if prefix and (body or tables):  # an empty table (no features set) is left out
        lines += ["", "[" + ".".join(_key(p) for p in prefix) + "]"]
    lines += body
    for name in tables:
        _render_table(table[name], prefix + (name,), explicit, lines)


def _commented_keys(prefix: tuple, explicit: set | None) -> list:
    if explicit is None:
        return []
    dotted = ".".join(prefix)
    return [k[len(dotted) + 1:] if dotted else k for k in EXAMPLES
            if (k.rsplit(".", 1)[0] if "." in k else "") == dotted]


def _should_comment(key: str, value: Any) -> bool:
    if key == "nvidia-container-runtime.debug" and value == "/dev/null":
        return True
    return value is None or value == "" or value == EXAMPLES[key]


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else '"' + name.replace('"', '\\"') + '"'


def _value(value: Any) -> str:
    import tomlkit

    return tomlkit.item(value).as_string()
