"""The fields of a CDI spec, their types, and the ``cdiVersion`` each needs.

The CDI library decodes strictly (an unknown field is an error) and then
asks for the *minimum required version*: a field added in version X counts
only when it is set (non-empty, non-zero, true; ``intelRdt`` and
``intelRdt.schemata`` when present at all), and a spec declaring an older
version is rejected. Two rules are about names: a device name starting with a
digit needs 0.5.0, a dot in the class 0.6.0. ``enableCMT``/``enableMBM`` of
``intelRdt`` were dropped in 1.1.0, so they are unknown fields there.

One table drives both the check of a spec read from disk and the choice of
the lowest version for a spec nvct writes, so the two cannot disagree.
"""

from __future__ import annotations

from nvct.base.record import Record
from nvct.cdi import version
from nvct.cdi.version import EARLIEST
from nvct.request import cdinames as names

TYPE_CHECKING = False  # typing costs an import on every CDI container start
if TYPE_CHECKING:
    from typing import Any, Mapping


class Invalid(Exception):
    """A spec breaks a rule; the message says where (``devices[2].name``) and why."""


class _Field(Record):
    """One field: its type (str int64 uint32 bool strs uint32s map obj objs), the first
    version with it, the first without it, its sub-fields, and whether it needs
    ``since`` whenever present (Go pointers) rather than only when set."""

    __slots__ = ("type", "since", "until", "fields", "needs_when_present")
    _defaults = {"since": EARLIEST, "until": None, "fields": None, "needs_when_present": False}
    type: str
    since: str
    until: str | None
    fields: Mapping[str, _Field] | None
    needs_when_present: bool


_NODE = {
    "path": _Field("str"),
    "hostPath": _Field("str", "0.5.0"),
    "type": _Field("str"),
    "major": _Field("int64"),
    "minor": _Field("int64"),
    "fileMode": _Field("uint32"),
    "permissions": _Field("str"),
    "uid": _Field("uint32"),
    "gid": _Field("uint32"),
}
_MOUNT = {
    "hostPath": _Field("str"),
    "containerPath": _Field("str"),
    "options": _Field("strs"),
    "type": _Field("str", "0.4.0"),
}
_HOOK = {
    "hookName": _Field("str"),
    "path": _Field("str"),
    "args": _Field("strs"),
    "env": _Field("strs"),
    "timeout": _Field("int64"),
}
_INTEL_RDT = {
    "closID": _Field("str"),
    "l3CacheSchema": _Field("str"),
    "memBwSchema": _Field("str"),
    "enableCMT": _Field("bool", until="1.1.0"),
    "enableMBM": _Field("bool", until="1.1.0"),
    "schemata": _Field("strs", "1.1.0", needs_when_present=True),
    "enableMonitoring": _Field("bool", "1.1.0"),
}
_NET_DEVICE = {
    "hostInterfaceName": _Field("str"),
    "name": _Field("str"),
}
_EDITS = {
    "env": _Field("strs"),
    "deviceNodes": _Field("objs", fields=_NODE),
    "hooks": _Field("objs", fields=_HOOK),
    "mounts": _Field("objs", fields=_MOUNT),
    "intelRdt": _Field("obj", "0.7.0", fields=_INTEL_RDT, needs_when_present=True),
    "additionalGids": _Field("uint32s", "0.7.0"),
    "netDevices": _Field("objs", "1.1.0", fields=_NET_DEVICE),
}
_DEVICE = {
    "name": _Field("str"),
    "annotations": _Field("map", "0.6.0"),
    "containerEdits": _Field("obj", fields=_EDITS),
}
SPEC = {
    "cdiVersion": _Field("str"),
    "kind": _Field("str"),
    "annotations": _Field("map", "0.6.0"),
    "devices": _Field("objs", fields=_DEVICE),
    "containerEdits": _Field("obj", fields=_EDITS),
}


class Need(Record):
    """A version bound and the field (or name) that sets it."""

    __slots__ = ("version", "where")
    version: str
    where: str


class _Bounds:
    def __init__(self) -> None:
        self.low = Need(EARLIEST, "")
        self.high: Need | None = None   # first version that lacks a field in use

    def need(self, since: str, where: str) -> None:
        if version.rank(since) > version.rank(self.low.version):
            self.low = Need(since, where)

    def cap(self, until: str, where: str) -> None:
        if self.high is None or version.rank(until) < version.rank(self.high.version):
            self.high = Need(until, where)


def check(raw: Any, declared: str) -> None:
    """Check types and fields of ``raw`` against the ``declared`` (normalized) version."""
    bounds = _walk_spec(raw)
    if bounds.high is not None and version.rank(declared) >= version.rank(bounds.high.version):
        raise Invalid(f"{bounds.high.where}: unknown field in cdiVersion {declared} "
                      f"(removed in {bounds.high.version})")
    if version.rank(bounds.low.version) > version.rank(declared):
        raise Invalid(f"{bounds.low.where} needs cdiVersion {bounds.low.version} or later, "
                      f"but the spec declares {declared}")


def minimum_version(raw: Any) -> str:
    """The lowest version that can express ``raw`` (whatever its ``cdiVersion`` says)."""
    bounds = _walk_spec(raw)
    if bounds.high is not None and version.rank(bounds.low.version) >= version.rank(bounds.high.version):
        raise Invalid(f"no cdiVersion has both {bounds.low.where} (from {bounds.low.version}) "
                      f"and {bounds.high.where} (until {bounds.high.version})")
    return bounds.low.version


def _walk_spec(raw: Any) -> _Bounds:
    bounds = _Bounds()
    _walk(raw, SPEC, "", bounds)
    _name_rules(raw, bounds)
    return bounds


def _name_rules(raw: Mapping[str, Any], bounds: _Bounds) -> None:
    kind = raw.get("kind")
    if isinstance(kind, str):
        vendor, cls = names.split_kind(kind)
        if vendor and "." in cls:
            bounds.need("0.6.0", f"kind {kind!r} (a dot in the class)")
    for i, device in enumerate(raw.get("devices") or ()):
        name = device.get("name")
        if isinstance(name, str) and name[:1].isdigit():
            bounds.need("0.5.0", f"devices[{i}].name {name!r} (a leading digit)")


def _walk(value: Any, fields: Mapping[str, _Field], where: str, bounds: _Bounds) -> None:
    if not isinstance(value, dict):
        raise Invalid(f"{where or 'spec'}: expected a mapping, got {_describe(value)}")
    for key, item in value.items():
        path = f"{where}.{key}" if where else str(key)
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            raise Invalid(f"{path}: unknown field")
        if f.until is not None:
            bounds.cap(f.until, path)
        if item is None:  # JSON null: the zero value, as Go decodes it
            continue
        _check_type(f, item, path, bounds)
        if f.since != EARLIEST and (f.needs_when_present or _is_set(item)):
            bounds.need(f.since, path)


def _check_type(f: _Field, item: Any, path: str, bounds: _Bounds) -> None:
    t = f.type
    if t == "str":
        _expect(isinstance(item, str), path, "a string", item)
    elif t == "bool":
        _expect(isinstance(item, bool), path, "true or false", item)
    elif t in ("int64", "uint32"):
        _check_int(t, item, path)
    elif t in ("strs", "uint32s", "objs"):
        _expect(isinstance(item, list), path, "a list", item)
        for i, element in enumerate(item):
            at = f"{path}[{i}]"
            if t == "strs":
                _expect(isinstance(element, str), at, "a string", element)
            elif t == "uint32s":
                _check_int("uint32", element, at)
            else:
                _walk(element, f.fields or {}, at, bounds)
    elif t == "map":
        _expect(isinstance(item, dict), path, "a mapping of strings", item)
        for k, v in item.items():
            _expect(isinstance(k, str), path, "string keys", k)
            _expect(isinstance(v, str), f"{path}.{k}", "a string", v)
    else:  # obj
        _walk(item, f.fields or {}, path, bounds)


def _check_int(t: str, item: Any, path: str) -> None:
    ok = isinstance(item, int) and not isinstance(item, bool)
    if t == "uint32":
        _expect(ok and 0 <= item < 2**32, path, "an integer from 0 to 4294967295", item)
    else:
        _expect(ok and -(2**63) <= item < 2**63, path, "a 64-bit integer", item)


def _is_set(item: Any) -> bool:
    return bool(item)  # "", 0, false, [] and {} are Go's zero values


def _expect(ok: bool, path: str, what: str, value: Any) -> None:
    if not ok:
        raise Invalid(f"{path}: expected {what}, got {_describe(value)}")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float, str)):
        text = repr(value)
        return f"{type(value).__name__} {text[:40]}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
