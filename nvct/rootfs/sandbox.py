"""Running the host's static ldconfig chrooted into a container root, confined.

A private mount namespace with procfs & co. under the root detached (their
magic links lead out of any chroot) and every other mount read-only, new
network and IPC namespaces, DAC capabilities only, no_new_privs, a fixed
environment, no inherited fds, and a time limit. See nvct.rootfs.ldconfig.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import sys
import time

from nvct.base.errors import ContainerError
from nvct.linux import privileges
from nvct.linux.fs import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REMOUNT,
    UMOUNT_NOFOLLOW,
    mount,
    open_no_symlinks,
    umount,
)
from nvct.linux.libc import libc as _libc
from nvct.linux.namespaces import mounts, unshare_mount_namespace

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

    from nvct.rootfs.root import Rootfs

# ldconfig writes files and symlinks owned by whoever owns the image's dirs.
_KEEP_CAPS = {"dac_override", "dac_read_search", "fowner"}
# Mounts whose files act on the host kernel or lead out of a chroot.
_DETACH_FSTYPES = {"proc", "sysfs", "cgroup", "cgroup2", "securityfs", "debugfs",
                   "tracefs", "bpf", "efivarfs", "nsfs", "binfmt_misc", "fusectl",
                   "configfs", "pstore"}
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_SETUP_FAILED = 126  # the child's exit status when it failed before exec
_SIGKILL = 9
_OUTPUT_LIMIT = 64 * 1024


def run(root: Rootfs, exe: int, argv: list[str], timeout: float,
        name: str, writable: Sequence[str] = ("/",)) -> str:
    """Run ``argv`` (ldconfig, open on ``exe``) chrooted into ``root``, confined; its output.

    ContainerError naming ``name`` when it fails or outlives ``timeout``.
    """
    root_real = os.readlink(f"/proc/self/fd/{root.fileno()}")
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
        if pid == 0:
            _child(root.fileno(), root_real, exe, argv, devnull, out_w, writable)
        os.close(out_w)
        out_w = -1
        output, status = _collect(pid, out_r, timeout)
    finally:
        os.close(devnull)
        os.close(out_r)
        if out_w >= 0:
            os.close(out_w)
    text = output.decode("utf-8", "replace")
    if status is None:
        raise ContainerError(f"ldconfig {name} in container root {root.path}: "
                             f"killed after {timeout:g}s")
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return text
    last = _last_line(text)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _SETUP_FAILED \
            and last.startswith("nvct: "):
        raise ContainerError(f"ldconfig in container root {root.path}: {last[6:]}")
    how = (f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status)
           else f"signal {os.WTERMSIG(status)}")
    raise ContainerError(f"ldconfig {name} failed in container root {root.path} "
                         f"({how}): {last or 'no output'}")


def _child(root_fd: int, root_real: str, exe: int, argv: list[str], devnull: int,
           out_w: int, writable: Sequence[str] = ("/",)) -> None:
    """Never returns: execs ldconfig or exits with _SETUP_FAILED."""
    try:
        _no_more_imports()  # every path below the chroot is the image's
        exe, devnull, out_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                               for fd in (exe, devnull, out_w))
        unshare_mount_namespace()
        if _libc.unshare(_CLONE_NEWNET | _CLONE_NEWIPC):
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(net, ipc): {os.strerror(err)}")
        _detach_pseudo_mounts(root_real)
        _freeze_other_mounts(root_real, writable)
        # root_fd still points into the caller's namespace, where procfs is
        # mounted: chroot into this namespace's copy of the root instead (no link followed).
        new_root = open_no_symlinks(root_real)
        old, new = os.fstat(root_fd), os.fstat(new_root)
        if (old.st_dev, old.st_ino) != (new.st_dev, new.st_ino):
            raise ContainerError(f"container root {root_real} changed under us")
        os.fchdir(new_root)
        os.chroot(".")
        os.chdir("/")
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.closerange(3, exe)
        os.closerange(exe + 1, os.sysconf("SC_OPEN_MAX"))
        privileges.drop_capabilities(_KEEP_CAPS)
        privileges.set_no_new_privs()
        os.execve(exe, argv, privileges.minimal_env())
    except BaseException as e:  # noqa: BLE001 - report, never return to the caller
        msg = f"nvct: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
        for fd in (out_w, 2):  # out_w is closed once stdout/stderr are the pipe
            try:
                os.write(fd, (" ".join(msg.split()) + "\n").encode())
                break
            except BaseException:  # noqa: BLE001 - try the next descriptor, never raise here
                continue
    os._exit(_SETUP_FAILED)


def _no_more_imports() -> None:
    """From here on only modules already loaded (or built in) can be imported: inside
    the container root an import would find the image's file and run it as root."""
    sys.path[:] = []
    sys.path_importer_cache.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") in ("BuiltinImporter",
                                                                                   "FrozenImporter")]


def _detach_pseudo_mounts(root_real: str) -> None:
    """Detach procfs & co. under the root (in our private mount namespace).

    Fails closed: if any is still there afterwards, ldconfig does not run.
    """
    prefix = root_real.rstrip("/") + "/"

    def under_root() -> list[str]:
        return [m.mount_point for m in mounts()
                if m.fstype in _DETACH_FSTYPES
                and (m.mount_point == root_real or m.mount_point.startswith(prefix))]

    for point in sorted(under_root(), key=len, reverse=True):
        try:
            umount(point, MNT_DETACH | UMOUNT_NOFOLLOW)
        except OSError:
            pass  # gone with a parent already; checked below
    left = under_root()
    if left:
        raise ContainerError(f"cannot detach {left[0]} before running ldconfig")


def _freeze_other_mounts(root_real: str, writable: Sequence[str]) -> None:
    """Make the mounts under the root read-only (in our private namespace) but the written ones.

    ldconfig makes SONAME links in every folder it scans, including folders
    the image's own ld.so.conf lists, such as the read-write host directory
    ``/tmp/nvidia-mps`` or a volume. Only the mounts holding ``writable``
    (paths inside the root: /etc and the folders nvct checked) stay
    writable. Fails closed: a mount that cannot be frozen stops ldconfig.
    """
    top = root_real.rstrip("/")
    points = list(dict.fromkeys(m.mount_point for m in mounts()
                                if m.mount_point.startswith(top + "/")))

    def holder(path: str) -> str:
        return max((p for p in [root_real, *points] if path == p or path.startswith(p.rstrip("/") + "/")),
                   key=len)

    keep = {holder(top + (w if w != "/" else "")) for w in writable}
    for point in points:
        if point in keep:
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # covered by a later mount, or gone with a detached parent
        if flags & os.ST_RDONLY:
            continue
        keep_flags = ((MS_NOSUID if flags & os.ST_NOSUID else 0) | (MS_NODEV if flags & os.ST_NODEV else 0)
                      | (MS_NOEXEC if flags & os.ST_NOEXEC else 0))
        try:
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep_flags)
        except OSError as e:
            raise ContainerError(f"cannot make {point} read-only before running ldconfig: "
                                 f"{e.strerror}") from None


def _collect(pid: int, fd: int, timeout: float) -> tuple[bytes, int | None]:
    """Child's output (the last 64 KiB) and wait status; None status on timeout."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, _SIGKILL)
            os.waitpid(pid, 0)
            return bytes(buf), None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        del buf[:-_OUTPUT_LIMIT]
    try:  # output closed: the child exits now; wait on a pidfd rather than polling
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return bytes(buf), status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, _SIGKILL)
                os.waitpid(pid, 0)
                return bytes(buf), None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(0.0005)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else "?" for c in lines[-1])
    return line[:300]
