"""Filesystem system calls nvct's safe writes are built on: openat2, mount, statx, statfs.

Thin ctypes wrappers, no policy: :mod:`nvct.rootfs.root` decides what may be
opened or mounted inside a container's root, :mod:`nvct.linux.namespaces`
makes private mount namespaces with them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from nvct.linux.libc import libc, oserror

# openat2(2): same number on every architecture that has it (added in 5.6).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
_RESOLVE = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
_AT_FDCWD = -100
MAX_HOPS = 40  # the kernel's MAXSYMLINKS

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

TMPFS_MAGIC = 0x01021994
PROC_SUPER_MAGIC = 0x9FA0
# Filesystems where creating or changing anything talks to the host kernel.
PSEUDO_FS = {
    PROC_SUPER_MAGIC: "procfs",
    0x62656572: "sysfs",
    0x0027E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x73636673: "securityfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0xCAFE4A11: "bpffs",
    0xDE5E81E4: "efivarfs",
    0x6E736673: "nsfs",
}


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_have_openat2: bool | None = None  # None: not probed yet


def openat2(dirfd: int, path: str, flags: int, resolve: int = _RESOLVE) -> int:
    how = _OpenHow(flags, 0, resolve)
    for _ in range(16):  # EAGAIN: a concurrent rename raced with ".."
        # syscall(2) is variadic: pass full-width integers
        fd = libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(dirfd),
                           os.fsencode(path), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        if ctypes.get_errno() != errno.EAGAIN:
            break
    raise oserror(path)


def openat2_available() -> bool:
    """Whether the kernel has openat2(2) (Linux 5.6+); probed once."""
    global _have_openat2
    if _have_openat2 is None:
        try:
            os.close(openat2(_AT_FDCWD, "/", os.O_PATH | os.O_CLOEXEC))
            _have_openat2 = True
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            _have_openat2 = False
    return _have_openat2


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    """mount(2); raises OSError naming ``target``."""
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)):
        raise oserror(target)


def umount(target: str, flags: int = 0) -> None:
    """umount2(2); raises OSError naming ``target``."""
    if libc.umount2(os.fsencode(target), flags):
        raise oserror(target)


def fs_type(fd: int) -> int:
    """The ``f_type`` magic of the filesystem holding ``fd`` (O_PATH is fine)."""
    buf = ctypes.create_string_buffer(256)  # > sizeof(struct statfs) everywhere
    if libc.fstatfs(fd, buf):
        raise oserror()
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


_STATX_MNT_ID = 0x1000
_AT_EMPTY_PATH = 0x1000
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_MNT_ID_OFFSET = 0x90  # struct statx: stx_mnt_id
_have_statx_mnt_id: bool | None = None


def mount_id(fd: int) -> int:
    """The id of the mount holding ``fd`` (statx's STATX_MNT_ID, else /proc/self/fdinfo)."""
    global _have_statx_mnt_id
    if _have_statx_mnt_id is not False:
        buf = ctypes.create_string_buffer(256)  # sizeof(struct statx)
        if libc.statx(fd, b"", _AT_EMPTY_PATH | _AT_SYMLINK_NOFOLLOW, _STATX_MNT_ID, buf) == 0:
            mask = ctypes.c_uint32.from_buffer(buf).value
            if mask & _STATX_MNT_ID:
                _have_statx_mnt_id = True
                return ctypes.c_uint64.from_buffer(buf, _STATX_MNT_ID_OFFSET).value
        _have_statx_mnt_id = False  # older kernel (< 5.8) or libc without statx
    with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
        for line in f:
            if line.startswith(b"mnt_id:"):
                return int(line.split()[1])
    raise OSError(errno.ENOTSUP, "cannot tell the mount of an fd", f"/proc/self/fdinfo/{fd}")


def mount_ns() -> tuple[int, int] | None:
    try:
        st = os.stat("/proc/self/ns/mnt")
    except OSError:
        return None  # no /proc: cannot tell (and /proc/self/fd mounts fail anyway)
    return st.st_dev, st.st_ino


def open_no_symlinks(path: str) -> int:
    """O_PATH fd of the directory at absolute ``path``, no symlink followed in any component.

    openat2's ``RESOLVE_NO_SYMLINKS`` from ``/``, or an O_NOFOLLOW walk where
    the kernel lacks it. A symlink anywhere fails with ELOOP.
    """
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    if openat2_available():
        return openat2(_AT_FDCWD, path, flags, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = os.open("/", flags)
    try:
        for part in path.split("/"):
            if part in ("", "."):
                continue
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            if not stat.S_ISDIR(mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    except BaseException:
        os.close(fd)
        raise
    return fd


