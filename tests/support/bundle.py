"""OCI bundles (rootfs + config.json) for driving runc and crun directly.

The spec is the one ``runc spec`` writes (runc 1.1, ociVersion 1.0.2-dev),
non-interactive, with knobs for what the nvct tests vary.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Iterator, Mapping, Sequence

CONFIG = "config.json"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What ``runc spec`` grants.
DEFAULT_CAPS = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")
HOOK_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer",
               "poststart", "poststop")

# Capability numbers (linux/capability.h) -> names, for the privileged set.
_CAP_NAMES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL",
    "SETGID", "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE",
    "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL",
    "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
    "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)

_BASE_SPEC = {
    "ociVersion": "1.0.2-dev",
    "process": {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": ["sh"],
        "env": [DEFAULT_PATH],
        "cwd": "/",
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
        "noNewPrivileges": True,
    },
    "root": {"path": "rootfs", "readonly": False},
    "hostname": "nvct",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666",
                     "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
    ],
    "linux": {
        "resources": {"devices": [{"allow": False, "access": "rwm"}]},
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        "maskedPaths": [
            "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys",
            "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
            "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
        ],
        "readonlyPaths": [
            "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
        ],
    },
}


def make_bundle(bundle_dir: str | os.PathLike, rootfs: str | os.PathLike,
                args: Sequence[str], env: Sequence[str] = (), *,
                privileged: bool = False, mounts: Sequence[Mapping] = (),
                annotations: Mapping[str, str] | None = None,
                readonly: bool = False, caps: Sequence[str] | None = None,
                hooks: Mapping[str, Sequence[Mapping]] | None = None) -> str:
    """Write ``<bundle_dir>/config.json`` for running ``args`` in ``rootfs``.

    ``env`` entries (``"K=V"``) follow the default PATH (a PATH in ``env``
    replaces it). ``privileged`` is what ``docker run --privileged`` means:
    every capability the host allows, devices allowed, /sys and cgroups
    writable, nothing masked. ``caps`` replaces the capability sets.
    """
    bundle_dir = os.path.abspath(os.fspath(bundle_dir))
    rootfs = os.path.abspath(os.fspath(rootfs))
    os.makedirs(bundle_dir, exist_ok=True)
    spec = copy.deepcopy(_BASE_SPEC)
    process = spec["process"]
    process["args"] = list(args)
    if any(e.startswith("PATH=") for e in env):
        process["env"] = []
    process["env"].extend(env)
    spec["root"] = {"path": "rootfs" if rootfs == os.path.join(bundle_dir, "rootfs")
                    else rootfs, "readonly": readonly}
    if caps is None:
        caps = host_capabilities() if privileged else DEFAULT_CAPS
    process["capabilities"] = {s: list(caps) for s in
                               ("bounding", "effective", "permitted", "ambient")}
    if privileged:
        _make_privileged(spec)
    spec["mounts"].extend(copy.deepcopy(list(mounts)))
    if annotations:
        spec["annotations"] = dict(annotations)
    if hooks:
        spec["hooks"] = {stage: [dict(h) for h in entries]
                         for stage, entries in hooks.items()}
    write_config(bundle_dir, spec)
    return bundle_dir


def _make_privileged(spec: dict) -> None:
    spec["process"]["noNewPrivileges"] = False
    linux = spec["linux"]
    linux["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
    linux["maskedPaths"] = []
    linux["readonlyPaths"] = []
    for mount in spec["mounts"]:
        if mount["destination"] in ("/sys", "/sys/fs/cgroup"):
            mount["options"] = [o for o in mount["options"] if o != "ro"] + ["rw"]


def host_capabilities() -> list[str]:
    """Names of the capabilities in our bounding set (a runtime can grant no more)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                mask = int(line.split()[1], 16)
                break
        else:  # pragma: no cover - every Linux has CapBnd
            return list(DEFAULT_CAPS)
    return [f"CAP_{name}" for bit, name in enumerate(_CAP_NAMES) if mask >> bit & 1]


def config_path(bundle_dir: str | os.PathLike) -> str:
    return os.path.join(os.fspath(bundle_dir), CONFIG)


def read_config(bundle_dir: str | os.PathLike) -> dict:
    with open(config_path(bundle_dir)) as f:
        return json.load(f)


def write_config(bundle_dir: str | os.PathLike, spec: Mapping) -> None:
    """One line, as docker, containerd, podman and cri-o write it (Go's encoding/json)."""
    with open(config_path(bundle_dir), "w") as f:
        json.dump(spec, f, separators=(",", ":"))
        f.write("\n")


@contextlib.contextmanager
def edit_config(bundle_dir: str | os.PathLike) -> Iterator[dict]:
    """``with edit_config(b) as spec: spec[...] = ...`` -- written back on exit."""
    spec = read_config(bundle_dir)
    yield spec
    write_config(bundle_dir, spec)


def add_hook(bundle_dir: str | os.PathLike, stage: str, path: str,
             args: Sequence[str] | None = None, env: Sequence[str] | None = None,
             timeout: int | None = None) -> None:
    """Append an OCI hook (``path``, ``args`` with argv[0], ``env``) to ``stage``."""
    if stage not in HOOK_STAGES:
        raise ValueError(f"unknown OCI hook stage {stage!r}")
    hook: dict = {"path": path}
    if args is not None:
        hook["args"] = list(args)
    if env is not None:
        hook["env"] = list(env)
    if timeout is not None:
        hook["timeout"] = timeout
    with edit_config(bundle_dir) as spec:
        spec.setdefault("hooks", {}).setdefault(stage, []).append(hook)
