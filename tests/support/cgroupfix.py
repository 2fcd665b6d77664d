"""Make crun usable on a hybrid cgroup host.

crun refuses to run ("cgroups in hybrid mode not supported, drop all
controllers from cgroupv2") while the cgroup2 mount at
/sys/fs/cgroup/unified owns any controller. Mounting each such controller as
a v1 hierarchy moves it out of cgroup2; runc, docker, containerd and podman
keep working. Pure v2 hosts and pure v1 hosts need nothing.
"""

from __future__ import annotations

import os
import subprocess

CGROUP_ROOT = "/sys/fs/cgroup"
UNIFIED = "/sys/fs/cgroup/unified"


class CgroupFixError(RuntimeError):
    """A controller could not be moved to a v1 hierarchy."""


def ensure_crun_works() -> list[str]:
    """Move every controller out of the hybrid cgroup2 mount. Idempotent.

    Returns the controllers this call mounted (empty when nothing was needed).
    """
    if not _is_cgroup2(UNIFIED) or _is_cgroup2(CGROUP_ROOT):
        return []
    mounted = []
    for controller in _unified_controllers():
        target = os.path.join(CGROUP_ROOT, controller)
        os.makedirs(target, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "cgroup", "-o", controller, "cgroup", target],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            mounted.append(controller)
        elif controller in _unified_controllers():
            # A concurrent fixer may have won the race; only fail if still unfixed.
            raise CgroupFixError(f"mount -t cgroup -o {controller} cgroup {target}: "
                                 f"{proc.stderr.strip()}")
    return mounted


def needs_fix() -> bool:
    """True while crun would refuse to run on this host."""
    return (_is_cgroup2(UNIFIED) and not _is_cgroup2(CGROUP_ROOT)
            and bool(_unified_controllers()))


def _unified_controllers() -> list[str]:
    try:
        with open(os.path.join(UNIFIED, "cgroup.controllers")) as f:
            return f.read().split()
    except OSError:
        return []


def _is_cgroup2(path: str) -> bool:
    """True if ``path`` itself is a cgroup2 mount point."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split()[4] == path and right.split()[0] == "cgroup2":
                return True
    return False
