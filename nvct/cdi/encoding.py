"""CDI spec files as bytes: JSON or YAML in, either out.

The CDI library reads every spec as YAML (JSON is YAML) with Go's YAML 1.1
rules, strictly: a repeated key is an error. Two differences from PyYAML
matter, and are removed here:

* PyYAML reads ``1:0`` -- a MIG device name as nvidia-ctk writes it,
  unquoted -- as the base-60 integer 60; Go's YAML has no base 60;
* PyYAML keeps the last of two equal keys silently.

JSON takes the fast path (``json`` is much quicker than YAML on the shim's
hot path); PyYAML, C-accelerated where available, is imported only for YAML.
"""

from __future__ import annotations

import os

from nvct.cdi.schema import Invalid

TYPE_CHECKING = False  # typing costs an import on every CDI container start
if TYPE_CHECKING:
    from typing import Any

FORMATS = ("yaml", "json")
#: The extensions CDI runtimes read (podman ignores ``.yml``).
EXTENSIONS = {".yaml": "yaml", ".json": "json"}

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.1 ints and floats as PyYAML resolves them, minus the base-60 forms.
_INT_PATTERN = (r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$""")
_FLOAT_PATTERN = (r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""")


def format_for(path: str) -> str | None:
    """``yaml`` or ``json`` from a file name's extension (``.yml`` counts as YAML), else None."""
    ext = os.path.splitext(path)[1].lower()
    return "yaml" if ext == ".yml" else EXTENSIONS.get(ext)


def loads(data: bytes | str) -> Any:
    """Parse a spec file's content; :class:`Invalid` (one line) when it is not JSON/YAML."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Invalid(f"not UTF-8 text (byte {e.start})") from None
    if data.lstrip().startswith("{"):
        import json

        try:
            return json.loads(data, object_pairs_hook=_json_object)
        except ValueError as e:
            json_error = f"invalid JSON: {e}"
        try:
            return _yaml_load(data)
        except Invalid:
            raise Invalid(json_error) from None
    return _yaml_load(data)


def dumps(raw: Any, fmt: str) -> str:
    """``raw`` as JSON, or as YAML that Go and PyYAML read back identically."""
    if fmt == "json":
        import json

        return json.dumps(raw, indent=2) + "\n"
    if not isinstance(raw, dict) or not raw:
        return _pyyaml_dump(raw)
    lines = ["---"]
    try:
        _emit_mapping(raw, "", lines)
    except _NotPlainAscii:
        return _pyyaml_dump(raw)
    lines.append("")
    return "\n".join(lines)


# A spec is mappings, lists, strings, integers and booleans; writing it directly is
# ten times quicker than PyYAML's Python-level representer (nvct cdi generate's budget).
# Strings are plain only where no YAML 1.1 reader (Go's or PyYAML) can take them for
# anything else; the rest are double-quoted, JSON escapes being YAML escapes.
# No re (with json's import, ~8 ms of a generate): plain is [A-Za-z_/][A-Za-z0-9_./+=,@:-]*.
_PLAIN_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_/")
_PLAIN_REST = _PLAIN_FIRST | frozenset("0123456789.+=,@:-")
_PLAIN_REST_CHARS = "".join(sorted(_PLAIN_REST))  # for str.strip: the check runs in C
_YAML11_WORDS = frozenset(
    "y n yes no true false on off null".split())


class _NotPlainAscii(Exception):
    """A string PyYAML should escape (not printable ASCII)."""


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        if _is_plain(value) and not value.endswith(":") and value.lower() not in _YAML11_WORDS:
            return value
        if not (value.isascii() and value.isprintable()):
            raise _NotPlainAscii
        from nvct.base import jsoncodec

        return jsoncodec.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise _NotPlainAscii  # floats and the like: PyYAML's business


def _is_plain(value: str) -> bool:
    return bool(value) and value[0] in _PLAIN_FIRST and not value.strip(_PLAIN_REST_CHARS)


def _emit_mapping(mapping: dict, indent: str, out: list[str], first: str | None = None) -> None:
    for i, (key, value) in enumerate(mapping.items()):
        prefix = first if (first is not None and i == 0) else indent
        if isinstance(value, dict) and value:
            out.append(f"{prefix}{_scalar(key)}:")
            _emit_mapping(value, indent + "  ", out)
        elif isinstance(value, list) and value:
            out.append(f"{prefix}{_scalar(key)}:")
            _emit_list(value, indent, out)
        else:
            out.append(f"{prefix}{_scalar(key)}: {_empty_or_scalar(value)}")


def _emit_list(items: list, indent: str, out: list[str]) -> None:
    for item in items:
        if isinstance(item, dict) and item:
            _emit_mapping(item, indent + "  ", out, first=indent + "- ")
        elif isinstance(item, list) and item:
            out.append(f"{indent}-")
            _emit_list(item, indent + "  ", out)
        else:
            out.append(f"{indent}- {_empty_or_scalar(item)}")


def _empty_or_scalar(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def _pyyaml_dump(raw: Any) -> str:
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return "---\n" + yaml.dump(raw, Dumper=dumper, sort_keys=False, default_flow_style=False,
                               allow_unicode=True, width=1 << 16)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Invalid(f"invalid JSON: key {key!r} appears twice in one object")
        out[key] = value
    return out


def _yaml_load(text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise Invalid(f"invalid YAML: {_yaml_reason(e)}") from None


def _yaml_reason(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return " ".join(f"{problem}{where}".split())


_LOADER: list = []  # the loader class, built once (no functools: the cdi-mode start imports this module)


def _loader():
    if _LOADER:
        return _LOADER[0]
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class _Loader(base):  # type: ignore[misc, valid-type]  # a base picked at run time: the C loader if built
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                self.flatten_mapping(node)
                seen = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        repeated = key in seen
                        seen.add(key)
                    except TypeError:
                        continue  # an unhashable key: the base class reports it
                    if repeated:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    _Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    import re

    _Loader.add_implicit_resolver(_INT_TAG, re.compile(_INT_PATTERN, re.X), list("-+0123456789"))
    _Loader.add_implicit_resolver(_FLOAT_TAG, re.compile(_FLOAT_PATTERN, re.X), list("-+0123456789."))
    _LOADER.append(_Loader)
    return _Loader
