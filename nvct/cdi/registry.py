"""The CDI spec directories, and resolving device names to container edits.

As the CDI library does it:

* directories are read in order, each file ending in ``.yaml`` or ``.json``
  (not ``.yml``, not subdirectories) in name order;
* a device in a later directory overrides the same device in an earlier one;
* two files of the *same* directory defining the same device conflict: the
  device is dropped and both files are reported;
* an invalid file is reported with its path and reason and otherwise
  ignored -- it never hides the devices of the valid ones;
* resolving names applies each spec's own edits once (with the first of its
  devices asked for), then each device's edits.

Where the library would fail on one unreadable directory, nvct reports it and
reads the others.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import RequestError, SpecError
from nvct.cdi import spec as spec_mod
from nvct.cdi.encoding import EXTENSIONS
from nvct.cdi.spec import Spec
from nvct.edits.model import ContainerEdits, DeviceNode
from nvct.request import cdinames as names

TYPE_CHECKING = False  # typing costs an import on every CDI container start
if TYPE_CHECKING:
    from typing import Iterable, Mapping

#: How many device names an error lists per kind before saying "and N more".
_LISTED = 8


class Device:
    """A device of a spec, by its fully-qualified name."""

    __slots__ = ("spec", "name")

    def __init__(self, spec: Spec, name: str):
        self.spec = spec
        self.name = name

    @property
    def qualified_name(self) -> str:
        return self.spec.qualified(self.name)

    @property
    def edits(self) -> Mapping:
        return self.spec.devices[self.name].get("containerEdits") or {}


class Registry:
    """Every spec in ``dirs`` (earlier directories first, so later ones win)."""

    def __init__(self, dirs: Iterable[str]):
        self.dirs = tuple(os.path.normpath(d) for d in dirs)
        self.specs: list[Spec] = []
        #: path (of a file or a directory) -> reasons it was not used (fully or at all).
        self.errors: dict[str, list[str]] = {}
        #: path -> why nothing of it was used (an invalid file, an unreadable directory).
        self.invalid: dict[str, str] = {}
        self.missing_dirs: list[str] = []
        self.devices: dict[str, Device] = {}
        #: qualified name -> the files of one directory that both define it.
        self.conflicts: dict[str, list[str]] = {}
        self._scan()

    @classmethod
    def from_specs(cls, specs: Iterable[Spec]) -> Registry:
        """A registry of in-memory specs (one priority), for generated specs."""
        registry = cls(())
        for s in specs:
            registry._add(s, {})
        return registry

    def device_names(self) -> list[str]:
        return sorted(self.devices)

    def problems(self) -> list[str]:
        """``path: reason`` lines for invalid files, unreadable dirs and conflicts."""
        return [f"{path}: {reason}" for path, reasons in self.errors.items() for reason in reasons]

    def resolve(self, requested: Iterable[str]) -> ContainerEdits:
        """Container edits for fully-qualified device names (repeats ignored).

        Any name no spec defines -- or one whose definitions conflict -- makes
        ONE error that lists them all with what was found instead.
        """
        wanted = list(dict.fromkeys(requested))
        unresolved = []
        found: list[Device] = []
        for name in wanted:
            try:
                names.parse_qualified(name)
            except ValueError as e:
                raise RequestError(f"CDI device request: {e}") from None
            device = self.devices.get(name)
            if device is None:
                unresolved.append(name)
            else:
                found.append(device)
        if unresolved:
            raise RequestError(self._unresolved_message(unresolved))
        edits = ContainerEdits()
        applied: set[int] = set()
        for device in found:
            if id(device.spec) not in applied:
                applied.add(id(device.spec))
                edits.extend(container_edits(device.spec.edits, device.spec.path))
            edits.extend(container_edits(device.edits, device.spec.path))
        _last_mount_wins(edits)
        return edits

    # --- scanning ---
    def _scan(self) -> None:
        for directory in self.dirs:
            try:
                with os.scandir(directory) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except FileNotFoundError:
                self.missing_dirs.append(directory)
                continue
            except OSError as e:
                self._invalid(directory, f"cannot read CDI spec directory: {e.strerror}")
                continue
            claimed: dict[str, Device] = {}
            for entry in entries:
                if os.path.splitext(entry.name)[1] not in EXTENSIONS or _is_dir(entry):
                    continue
                path = os.path.join(directory, entry.name)
                try:
                    spec = spec_mod.read(path)
                except SpecError as e:
                    self._invalid(path, _strip_path(str(e), path))
                    continue
                self._add(spec, claimed)
        for name in self.conflicts:
            self.devices.pop(name, None)

    def _add(self, spec: Spec, claimed: dict[str, Device]) -> None:
        """Index ``spec``'s devices; ``claimed`` holds those of its directory so far."""
        self.specs.append(spec)
        for name in spec.devices:
            device = Device(spec, name)
            qualified = device.qualified_name
            other = claimed.get(qualified)
            if other is not None:
                first = qualified not in self.conflicts
                paths = self.conflicts.setdefault(qualified, [other.spec.path])
                paths.append(spec.path)
                message = f"conflicting definitions of {qualified} in {other.spec.path} and {spec.path}"
                for path in (other.spec.path, spec.path) if first else (spec.path,):
                    self.errors.setdefault(path, []).append(message)
                continue
            claimed[qualified] = device
            self.devices[qualified] = device  # a later directory overrides

    # --- the error for names nobody defines ---
    def _unresolved_message(self, unresolved: list[str]) -> str:
        noun = "device" if len(unresolved) == 1 else "devices"
        parts = [f"unresolvable CDI {noun} {_some(unresolved)}"]
        looked = ", ".join(d + (" (missing)" if d in self.missing_dirs else "") for d in self.dirs)
        parts.append(f"looked in {looked or 'no directories'}")
        conflicting = [n for n in unresolved if n in self.conflicts]
        for name in conflicting:
            parts.append(f"{name} is defined in both {' and '.join(self.conflicts[name])}")
        by_kind: dict[str, list[str]] = {}
        for device in self.devices.values():
            by_kind.setdefault(device.spec.kind, []).append(device.name)
        if by_kind:
            kinds = []
            for kind in sorted(by_kind):
                kinds.append(f"{kind}: {_some(sorted(by_kind[kind]))}")
            parts.append("found " + "; ".join(kinds))
        else:
            parts.append("found no devices")
        if self.invalid:
            parts.append("skipped " + "; ".join(f"{p} ({why})" for p, why in self.invalid.items()))
        return "; ".join(parts)

    def _invalid(self, path: str, reason: str) -> None:
        self.invalid[path] = reason
        self.errors.setdefault(path, []).append(reason)


def _some(items: list[str]) -> str:
    more = f", and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return ", ".join(items[:_LISTED]) + more


def container_edits(raw: Mapping, where: str = "") -> ContainerEdits:
    """A validated CDI ``containerEdits`` as nvct edits, completed as at injection time.

    A device node that does not give its type and major is looked up on the
    host (its ``hostPath``), as the CDI library does when it injects it; the
    file mode is taken from the host when the spec gives none. Additional GID
    0 means nothing in CDI and is dropped.
    """
    if not raw:
        return ContainerEdits()
    edits = ContainerEdits.from_cdi(dict(raw, deviceNodes=[]))
    edits.device_nodes = [_device_node(node, where) for node in raw.get("deviceNodes") or ()]
    edits.additional_gids = [g for g in edits.additional_gids if g != 0]
    return edits


def _device_node(node: Mapping, where: str) -> DeviceNode:
    path = node["path"]
    host_path = node.get("hostPath") or path
    dtype = node.get("type") or ""
    major, minor = node.get("major") or 0, node.get("minor") or 0
    file_mode = node.get("fileMode")
    minimal = bool(dtype) and (major != 0 or dtype == "p")
    prefix = f"{where}: device {path}" if where else f"device {path}"
    try:
        info = _device_info(os.lstat(host_path))
        error = "not a device node"
    except OSError as e:
        info, error = None, e.strerror or str(e)
    if info is None:
        if not minimal:
            raise SpecError(f"{prefix}: cannot use host device {host_path}: {error}")
    else:
        host_type, host_major, host_minor, host_mode = info
        if file_mode is None:
            file_mode = host_mode
        if not minimal:
            dtype = dtype or host_type
            if dtype != host_type:
                raise SpecError(f"{prefix}: type {dtype!r} does not match "
                                f"host device {host_path} (type {host_type!r})")
            if dtype != "p" and major == 0:
                major, minor = host_major, host_minor
    return DeviceNode(
        path=path, major=major, minor=minor, type=dtype,
        host_path=node.get("hostPath") or None, file_mode=file_mode,
        uid=node.get("uid"), gid=node.get("gid"), permissions=node.get("permissions") or "",
    )


def _device_info(st: os.stat_result):
    mode = st.st_mode
    if stat.S_ISBLK(mode):
        kind = "b"
    elif stat.S_ISCHR(mode):
        kind = "c"
    elif stat.S_ISFIFO(mode):
        kind = "p"
    else:
        return None
    return kind, os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(mode)


def _last_mount_wins(edits: ContainerEdits) -> None:
    """Two mounts at one container path: the later replaces the earlier, as CDI applies them."""
    last = {os.path.normpath(m.container_path): i for i, m in enumerate(edits.mounts)}
    if len(last) != len(edits.mounts):
        edits.mounts = [m for i, m in enumerate(edits.mounts)
                        if last[os.path.normpath(m.container_path)] == i]


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _strip_path(message: str, path: str) -> str:
    prefix = f"{path}: "
    return message[len(prefix):] if message.startswith(prefix) else message
