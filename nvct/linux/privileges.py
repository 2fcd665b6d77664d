"""Dropping what a privileged hook must not keep or pass on.

The hook runs as root with all capabilities. Its environment is not ours to
trust: under ``docker --gpus`` it is dockerd's whole environment, and OCI
hooks get whatever the spec's ``env`` says (CVE-2025-23266 got LD_PRELOAD from
the image into a privileged hook). Children we start (ldconfig) get a fixed
environment and only the capabilities they need.

Capabilities are dropped with prctl(2)/capset(2) through libc: python-prctl
cost every start ~3 ms (its import and its name parsing) for the same calls.
"""

from __future__ import annotations

import ctypes
import os

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Iterable, MutableMapping

_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4

SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# Variables the dynamic loader, libc or Python act on: glibc's list of
# "unsecure" variables (those it drops for setuid programs) plus Python's own.
_UNSAFE = frozenset({
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN",
    "LOCPATH", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_CHECK_",
    "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_PERTURB_", "MALLOC_TOP_PAD_",
    "MALLOC_TRACE", "MALLOC_TRIM_THRESHOLD_", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF",
    "RES_OPTIONS", "TMPDIR", "TZDIR",
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONUSERBASE",
    "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "PYTHONBREAKPOINT", "PYTHONWARNINGS",
})
_UNSAFE_PREFIXES = ("LD_",)


def minimal_env() -> dict[str, str]:
    """The whole environment for programs we start: nothing inherited."""
    return {"PATH": SAFE_PATH}


def is_unsafe_env_name(name: str) -> bool:
    """Whether a variable named ``name`` can change how a program loads or runs."""
    return name in _UNSAFE or name.startswith(_UNSAFE_PREFIXES)


def sanitize_environ(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove loader/libc/Python control variables from ``environ`` (os.environ).

    Call at hook start. It protects every child the hook starts; it cannot
    undo what the dynamic loader already did for the hook itself, which is
    why the hook must never be registered with an environment taken from the
    image. Returns the names removed, sorted.
    """
    env = os.environ if environ is None else environ
    removed = sorted(name for name in list(env) if is_unsafe_env_name(name))
    for name in removed:
        del env[name]
    return removed


def _cap_name(name: str) -> str:
    name = name.lower()
    return name[4:] if name.startswith("cap_") else name


def drop_capabilities(keep: Iterable[str]) -> None:
    """Keep only ``keep`` (e.g. ``{"dac_override"}`` or ``{"CAP_DAC_OVERRIDE"}``).

    Limits the bounding set too: a root process that execs gets its bounding
    set as permitted capabilities, so this is what holds across execve.
    Inheritable and ambient sets are cleared. Unknown names raise ValueError;
    capabilities this module has no name for (a newer kernel's) are dropped.
    """
    names = {_cap_name(n) for n in keep}
    unknown = names.difference(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities: {', '.join(sorted(unknown))}")
    from nvct.linux.libc import libc
    _limit_bounding_set(libc, names)
    zero = ctypes.c_ulong(0)
    if libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), zero, zero,
                  zero) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clearing ambient capabilities: {os.strerror(err)}")
    _capset(libc, names)


def set_no_new_privs() -> None:
    """No exec from here on can gain privileges (setuid bits, file caps)."""
    from nvct.linux.libc import libc
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"PR_SET_NO_NEW_PRIVS: {os.strerror(err)}")


#: Capability names by number (linux/capability.h), without the CAP_ prefix.
CAPABILITIES = (
    "chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid",
    "setpcap", "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw",
    "ipc_lock", "ipc_owner", "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct",
    "sys_admin", "sys_boot", "sys_nice", "sys_resource", "sys_time", "sys_tty_config", "mknod",
    "lease", "audit_write", "audit_control", "setfcap", "mac_override", "mac_admin", "syslog",
    "wake_alarm", "block_suspend", "audit_read", "perfmon", "bpf", "checkpoint_restore",
)
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _limit_bounding_set(libc, names: set[str]) -> None:
    for number in range(64):  # past CAPABILITIES too: a newer kernel's are dropped, unnamed
        name = CAPABILITIES[number] if number < len(CAPABILITIES) else None
        if name in names or libc.prctl(_PR_CAPBSET_READ, ctypes.c_ulong(number), 0, 0, 0) != 1:
            continue  # kept, or not in the set (or unknown to this kernel)
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(number), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            what = f"CAP_{name.upper()}" if name else f"capability {number}"
            raise OSError(err, f"dropping {what} from the bounding set: {os.strerror(err)}")


def _capset(libc, names: set[str]) -> None:
    """Effective and permitted: ``names`` (as far as now permitted); inheritable: none."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capget: {os.strerror(err)}")
    for i in range(2):
        wanted = sum(1 << (n - 32 * i) for n, name in enumerate(CAPABILITIES)
                     if name in names and 32 * i <= n < 32 * (i + 1))
        keep = data[i].permitted & wanted
        data[i].effective = data[i].permitted = keep
        data[i].inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
