"""The cgroup version, and whether nvct's hook can grant device access on it.

The hook (``docker --gpus``, legacy mode) writes cgroup v1 ``devices.allow``
rules, and under cgroup v2 extends the runtime's eBPF device programs
(docs/cgroups.md). jit-cdi and cdi modes put the devices in the OCI spec,
where the runtime grants them on either version.
"""

from __future__ import annotations

import os

from nvct.doctor.model import Context, ok, warn


def mount_view(proc_root: str) -> str:
    """The mountinfo to read: the host's init's under the proc root, else this process's."""
    host = os.path.join(proc_root, "1/mountinfo")
    return host if os.path.isfile(host) else "/proc/self/mountinfo"


def cgroup_mounts(path: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(mount point, fstype, super options) of every cgroup and cgroup2 mount."""
    out = []
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            try:
                sep = fields.index("-")
            except ValueError:
                continue
            fstype = fields[sep + 1]
            if fstype in ("cgroup", "cgroup2"):
                options = tuple(fields[sep + 3].rstrip("\n").split(",")) if len(fields) > sep + 3 else ()
                out.append((fields[4], fstype, options))
    return out


def check_version(ctx: Context):
    proc_root = ctx.config.proc_root if ctx.config is not None else "/proc"
    path = mount_view(proc_root)
    try:
        mounts = cgroup_mounts(path)
    except OSError as e:
        yield warn("cgroup.version", f"{path}: {e.strerror}", "run nvct doctor as root on the host")
        return
    devices = [m for m in mounts if m[1] == "cgroup" and "devices" in m[2]]
    unified = [m for m in mounts if m[1] == "cgroup2"]
    if devices:
        kind = "hybrid (v1 controllers, v2 at " + unified[0][0] + ")" if unified else "v1"
        yield ok("cgroup.version", f"cgroup {kind}, devices controller at {devices[0][0]} ({path}): "
                 f"the hook (docker --gpus, legacy mode) can grant device access")
        return
    if not unified:
        yield warn("cgroup.version", f"{path} shows no cgroup mount", "mount cgroups (the container engine needs them)")
        return
    yield ok("cgroup.version", f"cgroup v2 at {unified[0][0]} ({path}): the hook (docker --gpus, legacy "
             "mode) grants device access by extending the runtime's eBPF device programs")

CHECKS = (check_version,)
