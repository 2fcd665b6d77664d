"""Dropping what a privileged hook must not keep or pass on.

The hook runs as root with all capabilities. Its environment is not ours to
trust: under ``docker --gpus`` it is dockerd's whole environment, and OCI
hooks get whatever the spec's ``env`` says (CVE-2025-23266 got LD_PRELOAD from
the image into a privileged hook). Children we start (ldconfig) get a fixed
environment and only the capabilities they need.

python-prctl is imported only when capabilities are dropped, keeping the
hook's start-up import cost to the standard library.
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
    Inheritable and ambient sets are cleared. Unknown names raise ValueError.
    """
    import prctl  # lazily: only privileged children need it

    names = {_cap_name(n) for n in keep}
    unknown = names.difference(prctl.ALL_CAP_NAMES)
    if unknown:
        raise ValueError(f"unknown capabilities: {', '.join(sorted(unknown))}")
    prctl.capbset.limit(*names)
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), zero, zero,
                  zero) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clearing ambient capabilities: {os.strerror(err)}")
    prctl.cap_inheritable.limit()
    prctl.cap_effective.limit(*names)
    prctl.cap_permitted.limit(*names)


def set_no_new_privs() -> None:
    """No exec from here on can gain privileges (setuid bits, file caps)."""
    import prctl

    prctl.set_no_new_privs(1)


def preload_prctl() -> None:
    """Import python-prctl now, e.g. before a chroot hides its files."""
    import prctl  # noqa: F401
