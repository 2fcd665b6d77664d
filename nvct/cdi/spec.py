"""One CDI spec: read from a file, validated as the CDI library validates it.

A spec is kept as the mapping it was read as (so it writes back unchanged)
plus what validation established: its version, vendor, class and devices.
Validation follows the library: strict fields and minimum version
(:mod:`nvct.cdi.schema`), then the kind, the spec's own edits and each device
(name, non-empty edits, no name twice). Every failure is one line that starts
with the file's path.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import SpecError
from nvct.cdi import encoding, schema, version
from nvct.cdi.schema import Invalid
from nvct.edits.model import HOOK_STAGES
from nvct.request import cdinames as names

TYPE_CHECKING = False  # typing costs an import on every CDI container start
if TYPE_CHECKING:
    from typing import Any, Mapping

#: Larger files are refused: a spec directory is read on every CDI container start.
MAX_SPEC_BYTES = 32 << 20

_NODE_TYPES = ("", "b", "c", "u", "p")


class Spec:
    """A valid spec; ``devices`` maps each device name to its raw entry, in file order."""

    __slots__ = ("path", "raw", "version", "vendor", "cls", "devices")

    def __init__(self, path: str, raw: dict[str, Any], version: str, vendor: str, cls: str,
                 devices: dict[str, dict[str, Any]]):
        self.path = path
        self.raw = raw
        self.version = version
        self.vendor = vendor
        self.cls = cls
        self.devices = devices

    def __repr__(self) -> str:
        return f"Spec({self.path!r}, {self.kind}, cdiVersion {self.version}, {len(self.devices)} devices)"

    @property
    def kind(self) -> str:
        return f"{self.vendor}/{self.cls}"

    def qualified(self, name: str) -> str:
        return f"{self.kind}={name}"

    @property
    def edits(self) -> dict[str, Any]:
        """The spec-level ``containerEdits`` (applied once with any of its devices)."""
        return self.raw.get("containerEdits") or {}


def save(raw: Mapping[str, Any], path: str, fmt: str) -> str:
    """Write ``raw`` atomically (mode 0644, directory created); returns the path written.

    A name not ending in ``.yaml`` or ``.json`` gets ``fmt``'s extension
    appended, as the reference does: CDI runtimes read no other files.
    """
    from nvct.base.fileutil import write_atomic

    if os.path.splitext(path)[1] not in encoding.EXTENSIONS:
        path += "." + fmt
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        write_atomic(path, encoding.dumps(raw, fmt), mode=0o644)
    except OSError as e:
        raise SpecError(f"{path}: cannot write CDI spec: {e.strerror or e}") from None
    return path


def read(path: str) -> Spec:
    """Read and validate the spec at ``path``; SpecError names the file and the reason.

    The YAML/JSON parse is remembered by content (nvct.base.parsecache): in cdi mode
    the shim reads every spec on each container start, and PyYAML's import and
    parse cost ~35 ms of it. Validation still runs on every read.
    """
    return parse(_read_bytes(path), path, cache=True)


def parse(data: bytes | str, path: str, *, cache: bool = False) -> Spec:
    """Validate spec content; ``path`` is for messages (and the Spec's ``path``)."""
    try:
        if cache and isinstance(data, bytes):
            from nvct.base.parsecache import parse_cached

            raw = parse_cached(data, path, "cdi-spec", encoding.loads)
        else:
            raw = encoding.loads(data)
        if raw is None:
            raise Invalid("empty file (no spec)")
        return validate(raw, path)
    except Invalid as e:
        raise SpecError(f"{path}: {e}") from None


def validate(raw: Any, path: str = "<spec>") -> Spec:
    """Check a parsed spec; :class:`Invalid` says why it is not one."""
    if not isinstance(raw, dict):
        raise Invalid("not a CDI spec (expected a mapping with cdiVersion, kind and devices)")
    declared = raw.get("cdiVersion")
    v = version.normalize(declared)
    if v is None:
        if not declared:
            raise Invalid("cdiVersion is missing")
        raise Invalid(f"unknown cdiVersion {declared!r} (known: {', '.join(version.SUPPORTED)})")
    if version.rank(v) < version.rank(version.EARLIEST):
        raise Invalid(f"cdiVersion {v} is no longer supported (the earliest is {version.EARLIEST})")
    schema.check(raw, v)
    kind = raw.get("kind") or ""
    if not kind:
        raise Invalid("kind is missing")
    reason = names.kind_error(kind)
    if reason:
        raise Invalid(f"kind: {reason}")
    vendor, cls = names.split_kind(kind)
    check_edits(raw.get("containerEdits") or {}, "containerEdits")
    devices: dict[str, dict[str, Any]] = {}
    for i, device in enumerate(raw.get("devices") or ()):
        name = device.get("name") or ""
        where = f"devices[{i}]"
        reason = names.device_name_error(name)
        if reason:
            raise Invalid(f"{where}.name: {reason}")
        edits = device.get("containerEdits") or {}
        if is_empty(edits):
            raise Invalid(f"device {name!r} has no containerEdits (a device must change something)")
        check_edits(edits, f"device {name!r}: containerEdits")
        if name in devices:
            raise Invalid(f"device {name!r} is defined twice")
        devices[name] = device
    if not devices:
        raise Invalid("no devices (a spec defines at least one)")
    return Spec(os.path.normpath(path) if path != "<spec>" else path, raw, v, vendor, cls, devices)


def is_empty(edits: Mapping[str, Any]) -> bool:
    return not any(edits.get(k) for k in ("env", "deviceNodes", "hooks", "mounts",
                                          "additionalGids", "netDevices")) \
        and edits.get("intelRdt") is None


def check_edits(edits: Mapping[str, Any], where: str) -> None:
    """The library's rules for one ``containerEdits`` (types are already checked)."""
    _check_env(edits.get("env") or (), f"{where}.env")
    for i, node in enumerate(edits.get("deviceNodes") or ()):
        at = f"{where}.deviceNodes[{i}]"
        if not node.get("path"):
            raise Invalid(f"{at}.path is empty")
        if (node.get("type") or "") not in _NODE_TYPES:
            raise Invalid(f"{at}.type: invalid device type {node['type']!r} (b, c, u or p)")
        perms = node.get("permissions") or ""
        if perms != "none" and perms.strip("rwm"):
            raise Invalid(f"{at}.permissions: invalid {perms!r} (letters r, w, m, or none)")
    for i, hook in enumerate(edits.get("hooks") or ()):
        at = f"{where}.hooks[{i}]"
        if hook.get("hookName") not in HOOK_STAGES:
            raise Invalid(f"{at}.hookName: invalid {hook.get('hookName')!r} "
                          f"(one of {', '.join(HOOK_STAGES)})")
        if not hook.get("path"):
            raise Invalid(f"{at}.path is empty")
        _check_env(hook.get("env") or (), f"{at}.env")
    for i, mount in enumerate(edits.get("mounts") or ()):
        at = f"{where}.mounts[{i}]"
        for key in ("hostPath", "containerPath"):
            if not mount.get(key):
                raise Invalid(f"{at}.{key} is empty")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        clos = rdt.get("closID") or ""
        if clos != "/" and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos):
            raise Invalid(f"{where}.intelRdt.closID: invalid {clos[:40]!r} (must be a file name)")
    _check_net_devices(edits.get("netDevices") or (), f"{where}.netDevices")


def _check_env(env, where: str) -> None:
    for i, item in enumerate(env):
        if item.find("=") <= 0:
            raise Invalid(f"{where}[{i}]: {item!r} is not NAME=VALUE")


def _check_net_devices(devices, where: str) -> None:
    hosts: set[str] = set()
    inside: set[str] = set()
    for i, dev in enumerate(devices):
        host, name = dev.get("hostInterfaceName") or "", dev.get("name") or ""
        if not host or not name:
            raise Invalid(f"{where}[{i}]: hostInterfaceName and name must both be set")
        if host in hosts:
            raise Invalid(f"{where}[{i}]: host interface {host!r} is moved twice")
        if name in inside:
            raise Invalid(f"{where}[{i}]: container interface name {name!r} is used twice")
        hosts.add(host)
        inside.add(name)


def _read_bytes(path: str) -> bytes:
    """The file's content, refusing what is not a regular file (a fifo would hang us)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise SpecError(f"{path}: cannot read CDI spec: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{path}: not a regular file")
        if st.st_size > MAX_SPEC_BYTES:
            raise SpecError(f"{path}: {st.st_size} bytes is too large for a CDI spec "
                            f"(limit {MAX_SPEC_BYTES >> 20} MiB)")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_SPEC_BYTES:
                raise SpecError(f"{path}: too large for a CDI spec (limit {MAX_SPEC_BYTES >> 20} MiB)")
        return b"".join(chunks)
    except OSError as e:
        raise SpecError(f"{path}: cannot read CDI spec: {e.strerror}") from None
    finally:
        os.close(fd)
