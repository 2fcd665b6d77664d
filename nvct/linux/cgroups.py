"""Letting a container open the device nodes it was given.

A device node in the container is useless unless the container's devices
cgroup allows it. Under cgroup v1 that is a line like ``c 195:0 rw`` written
to the container's ``devices.allow``. Under cgroup v2 device access is decided by
the eBPF programs attached to the container's cgroup; nvct swaps the
runtime's for a copy that allows the injected char devices first and then
runs the runtime's own instructions unchanged, and refuses, naming it, any
other program that denies one of them (nvct.linux.bpf, docs/cgroups.md).

Paths come from the kernel (``/proc/<pid>/cgroup`` and this process's
mountinfo), never from the container, and are checked to stay inside the
devices hierarchy's mount.
"""

from __future__ import annotations

import os
import posixpath

from nvct.base.errors import ContainerError
from nvct.linux.namespaces import mounts

TYPE_CHECKING = False  # typing (and the re it imports) costs every legacy hook start ~4 ms
if TYPE_CHECKING:
    from typing import Iterable, Sequence, Tuple, Union

    #: (type 'c'|'b'|'a', major or None for any, minor or None for any, access 'rwm' subset)
    DeviceRule = Tuple[str, Union[int, None], Union[int, None], str]


def _controllers(pid: int) -> list[tuple[str, list[str], str]]:
    """(hierarchy id, controllers, cgroup path) per line of /proc/<pid>/cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            text = f.read()
    except OSError as e:
        raise ContainerError(f"cgroups of pid {pid}: {e.strerror}") from None
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[0], parts[1].split(",") if parts[1] else [], parts[2]))
    return out


def _devices_path(pid: int) -> str | None:
    for hid, controllers, path in _controllers(pid):
        if hid != "0" and "devices" in controllers:
            return path
    return None


def cgroup_version(pid: int) -> int:
    """The cgroup version that controls ``pid``'s device access: 1 or 2.

    Decided as runc and crun decide it: 2 when /sys/fs/cgroup itself is a
    cgroup2 mount (unified), 1 when a v1 ``devices`` hierarchy is mounted and
    lists the pid (legacy or hybrid setups), else 2 (a cgroup2 mount such as
    /sys/fs/cgroup/unified). The kernel lists v1 hierarchies in
    /proc/<pid>/cgroup even where none is mounted, so that file alone cannot tell.
    """
    table = list(mounts())
    if any(m.mount_point == "/sys/fs/cgroup" and m.fstype == "cgroup2" for m in table):
        return 2
    has_v1 = any(m.fstype == "cgroup" and "devices" in m.super_options for m in table)
    return 1 if has_v1 and _devices_path(pid) is not None else 2


def devices_cgroup_dir(pid: int) -> str:
    """The directory of ``pid``'s v1 devices cgroup, as seen by this process."""
    path = _devices_path(pid)
    if path is None:
        raise ContainerError(f"pid {pid} has no cgroup v1 devices controller")
    directory = _in_mount(pid, path, lambda m: m.fstype == "cgroup" and "devices" in m.super_options)
    if directory is None:
        raise ContainerError(f"devices cgroup {path} of pid {pid}: no mounted cgroup v1 "
                             "devices hierarchy shows it (is /sys/fs/cgroup/devices mounted?)")
    return directory


def unified_cgroup_dir(pid: int) -> str:
    """The directory of ``pid``'s cgroup v2 cgroup, as seen by this process.

    Found on any cgroup2 mount that shows it: /sys/fs/cgroup on a pure v2
    host, /sys/fs/cgroup/unified on a hybrid one.
    """
    path = next((p for hid, _, p in _controllers(pid) if hid == "0"), None)
    if path is None:
        raise ContainerError(f"pid {pid} is in no cgroup v2 cgroup (no 0:: line in /proc/{pid}/cgroup)")
    directory = _in_mount(pid, path, lambda m: m.fstype == "cgroup2")
    if directory is None:
        raise ContainerError(f"cgroup {path} of pid {pid}: no mounted cgroup2 hierarchy shows it "
                             "(is cgroup2 mounted at /sys/fs/cgroup?)")
    return directory


def _in_mount(pid: int, path: str, wanted) -> str | None:
    if not path.startswith("/") or any(p in (".", "..") for p in path.split("/")):
        raise ContainerError(f"cgroups of pid {pid}: odd cgroup path {path!r}")
    for m in _visible(list(mounts())):
        if not wanted(m):
            continue
        if m.root == "/":
            rel = path
        elif path == m.root or path.startswith(m.root + "/"):
            rel = path[len(m.root):]
        else:
            continue
        return posixpath.join(m.mount_point, rel.strip("/")).rstrip("/") or "/"
    return None


def _visible(table: list) -> list:
    """The mounts not hidden by a later mount on the same point or on a parent of it.

    A cgroup2 mounted over a hybrid host's /sys/fs/cgroup leaves the old
    /sys/fs/cgroup/unified in mountinfo, unreachable; paths through it would be wrong.
    """
    out = []
    for i, m in enumerate(table):
        point = m.mount_point.rstrip("/") + "/"
        if not any(point.startswith(later.mount_point.rstrip("/") + "/") for later in table[i + 1:]):
            out.append(m)
    return out


def format_rule(rule: DeviceRule) -> str:
    """``('c', 195, None, 'rw')`` -> ``'c 195:* rw'``; ValueError if malformed."""
    kind, major, minor, access = rule
    if kind not in ("a", "b", "c"):
        raise ValueError(f"device rule {rule!r}: type must be 'a', 'b' or 'c'")
    for number in (major, minor):
        if number is not None and (not isinstance(number, int) or isinstance(number, bool)
                                   or number < 0):
            raise ValueError(f"device rule {rule!r}: major/minor must be ints >= 0 or None")
    if not access or set(access) - set("rwm") or len(set(access)) != len(access):
        raise ValueError(f"device rule {rule!r}: access must be letters of 'rwm'")
    if kind == "a":
        return "a"
    def num(n: int | None) -> str:
        return "*" if n is None else str(n)

    return f"{kind} {num(major)}:{num(minor)} {access}"


def allow_devices(pid: int, rules: Iterable[DeviceRule]) -> None:
    """Allow ``rules`` in ``pid``'s devices cgroup, v1 (devices.allow) or v2 (eBPF).

    Raises ContainerError when the kernel refuses (e.g. the parent cgroup
    does not allow that device); with no rules nothing is touched.
    """
    rules = list(rules)
    lines = []
    for rule in rules:
        try:
            lines.append(format_rule(rule))
        except ValueError as e:
            raise ContainerError(str(e)) from None
    if not lines:
        return
    if cgroup_version(pid) == 1:
        _write_rules(os.path.join(devices_cgroup_dir(pid), "devices.allow"), lines)
        return
    _allow_v2(pid, rules)


def _allow_v2(pid: int, rules: list[DeviceRule]) -> None:
    devices = []
    for kind, major, minor, access in rules:
        if kind != "c" or major is None or minor is None or set(access) != set("rwm"):
            raise ContainerError(f"cgroup v2: nvct grants only whole char devices (rwm), "
                                 f"not {format_rule((kind, major, minor, access))!r}")
        devices.append((major, minor))
    directory = unified_cgroup_dir(pid)
    from nvct.linux import bpf

    try:
        notes = bpf.allow_char_devices(directory, devices)
    except bpf.PolicyError as e:
        raise ContainerError(f"cgroup v2: {e}") from None
    except OSError as e:
        raise ContainerError(f"cgroup v2 device program of {directory}: "
                             f"{e.strerror or e}") from None
    if notes:
        from nvct.base.log import logger

        for note in notes:
            logger.warning("cgroup v2: %s", note)


def _write_rules(path: str, lines: Sequence[str]) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ContainerError(f"{path}: {e.strerror}") from None
    try:
        for line in lines:  # the kernel takes one rule per write
            try:
                os.write(fd, line.encode())
            except OSError as e:
                raise ContainerError(f"{path}: cannot allow {line!r}: {e.strerror}") from None
    finally:
        os.close(fd)

