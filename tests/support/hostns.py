"""The suite's own copy of the host paths nvct's programs write: a private mount namespace.

A shim or hook start writes its records in /run/nvct, the installer and uninstaller
/run/nvidia/toolkit and /run/nvct-standins, podman's tests their CDI specs in /etc/cdi and /var/run/cdi.
On the host those are shared by every test run on the machine (and an installed nvct): two runs
at once saw each other's records. :func:`enter`, called by tests/conftest.py before any test
runs, moves the test process, and so every program the tests start (engines included), into a
mount namespace of its own, where:

* /run is a tmpfs holding each of the host's /run entries, bound (directories recursively, so
  their sockets and mounts are the host's), but for nvct's own (:data:`HIDDEN`): the suite does
  not see the host's records, and what it makes at the top of /run (/run/nvct) is an ordinary
  directory on the tmpfs, which ``rm -rf`` removes as the packages' scripts do;
* /etc/cdi, where the host has one, is an empty tmpfs.

Mounts under / are slaves of the host's: the host's new mounts still show, the suite's never
reach the host. Nothing here is an environment variable that nvct's programs read: they write
the paths they write on a node, and the namespace decides where that lands.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import tempfile

CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_MOVE, _MS_REC, _MS_SLAVE = 0x1000, 0x2000, 0x4000, 0x80000
#: The host's directory the suite has a copy of (the module's docstring).
RUN = "/run"
#: What the suite sees absent in its /run whatever the host has there: nvct's records, the
#: uninstaller's stand-ins, generated CDI specs, the installer's pid file (/run/nvidia/toolkit)
#: unless /run/nvidia holds a GPU node's driver container (``driver``), which the suite must see.
HIDDEN = ("nvct", "nvct-standins", "cdi", "nvidia")
#: The host's directories the suite sees empty (where they exist: none is made on the host).
EMPTIED = ("/etc/cdi",)
#: The host's /run, opened before the namespace was entered (O_PATH): where a test looks to see
#: that the suite left the host's alone. None until :func:`enter`.
host_run: int | None = None


def enter() -> bool:
    """Enter the private namespace (root only; the process must have one thread). False: not
    root, nothing done. Any failure raises, naming the step: a suite that would write the host's
    /run must not start."""
    global host_run
    if os.geteuid() != 0:
        return False
    host_run = os.open(RUN, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS) (is the test process threaded?)")
    _mount(libc, None, "/", None, _MS_REC | _MS_SLAVE)
    staging = tempfile.mkdtemp(prefix="nvct-hostns-")
    try:
        _mount(libc, "nvct-suite", staging, "tmpfs", 0, "mode=%o" % (os.stat(RUN).st_mode & 0o7777))
        for name in sorted(os.listdir(RUN)):
            if name not in HIDDEN or name == "nvidia" and os.path.lexists(f"{RUN}/nvidia/driver"):
                with contextlib.suppress(FileNotFoundError):  # gone since it was listed
                    _bind(libc, os.path.join(RUN, name), os.path.join(staging, name))
        _mount(libc, staging, RUN, None, _MS_MOVE)
    finally:
        with contextlib.suppress(OSError):  # busy only after a failure, which is raised
            os.rmdir(staging)
    for path in EMPTIED:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount(libc, "nvct-suite", path, "tmpfs", 0, "mode=0755")
    return True


def is_private() -> bool:
    """The process's /run is not the host's."""
    return host_run is not None and os.stat(RUN).st_dev != os.fstat(host_run).st_dev


def _bind(libc, source: str, target: str) -> None:
    """``target`` (on the tmpfs) shows ``source``: a link copied, anything else bound over a
    placeholder of its kind."""
    st = os.lstat(source)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(source), target)
        return
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(target)
    else:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    _mount(libc, source, target, None, _MS_BIND | _MS_REC)


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data))
    _check(rc, f"mount {source or ''} {target} ({fstype or 'flags'})")


def _bytes(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"the suite's private mount namespace: {what}: {os.strerror(errno)}")
