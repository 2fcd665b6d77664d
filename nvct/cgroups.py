"""Letting a container open the device nodes it was given.

A device node in the container is useless unless the container's devices
cgroup allows it. Under cgroup v1 that is a line like ``c 195:0 rw`` written
to the container's ``devices.allow``. Under cgroup v2 device access is an eBPF
program attached by the runtime; nvct's hook does not replace it, so there it
fails loudly (never pretends): CDI and jit-cdi modes put the devices into the
OCI spec, where the runtime grants them itself.

Paths come from the kernel (``/proc/<pid>/cgroup`` and this process's
mountinfo), never from the container, and are checked to stay inside the
devices hierarchy's mount.
"""

from __future__ import annotations

import os
import posixpath
from typing import Iterable, Sequence, Tuple, Union

from nvct.errors import ContainerError
from nvct.namespaces import mounts

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

    1 when a v1 ``devices`` hierarchy is listed for it (legacy or hybrid
    setups), else 2 (unified: devices are an eBPF program).
    """
    return 1 if _devices_path(pid) is not None else 2


def devices_cgroup_dir(pid: int) -> str:
    """The directory of ``pid``'s v1 devices cgroup, as seen by this process."""
    path = _devices_path(pid)
    if path is None:
        raise ContainerError(_V2_MESSAGE.format(pid=pid))
    if not path.startswith("/") or any(p in (".", "..") for p in path.split("/")):
        raise ContainerError(f"cgroups of pid {pid}: odd devices cgroup path {path!r}")
    for m in mounts():
        if m.fstype != "cgroup" or "devices" not in m.super_options:
            continue
        if m.root == "/":
            rel = path
        elif path == m.root or path.startswith(m.root + "/"):
            rel = path[len(m.root):]
        else:
            continue
        return posixpath.join(m.mount_point, rel.strip("/")).rstrip("/") or "/"
    raise ContainerError(f"devices cgroup {path} of pid {pid}: no mounted cgroup v1 "
                         "devices hierarchy shows it (is /sys/fs/cgroup/devices mounted?)")


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
    num = (lambda n: "*" if n is None else str(n))
    return f"{kind} {num(major)}:{num(minor)} {access}"


def allow_devices(pid: int, rules: Iterable[DeviceRule]) -> None:
    """Allow ``rules`` in ``pid``'s devices cgroup (cgroup v1 only).

    Raises ContainerError under cgroup v2 and when the kernel refuses a rule
    (e.g. the parent cgroup does not allow that device).
    """
    lines = []
    for rule in rules:
        try:
            lines.append(format_rule(rule))
        except ValueError as e:
            raise ContainerError(str(e)) from None
    directory = devices_cgroup_dir(pid)
    _write_rules(os.path.join(directory, "devices.allow"), lines)


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


_V2_MESSAGE = (
    "pid {pid} is under cgroup v2, where device access is an eBPF program the "
    "runtime owns; nvct's hook cannot grant devices there: use mode 'cdi' or "
    "'jit-cdi' so the runtime grants them from the OCI spec")
