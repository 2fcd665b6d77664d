"""Mounting onto paths of a container root: bind mounts, tmpfs, a file's data, the root read-only.

Each mount goes onto ``/proc/self/fd/<fd>`` of the resolved target, and is
checked afterwards to be what a fresh resolution of the path shows; if not
(the tree changed under us), it is detached again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from nvct.base.errors import ContainerError
from nvct.linux.fs import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    TMPFS_MAGIC,
    fs_type,
    mount,
    oserror,
    umount,
)
from nvct.linux.libc import libc
from nvct.rootfs.files import _Files
from nvct.rootfs.resolve import normalize, procfd


class _Mounts(_Files):
    """Mounts onto resolved targets, each verified to have landed where its path leads."""

    def bind_mount(self, host_path: str, container_path: str, *, readonly: bool = True,
                   nosuid: bool = True, nodev: bool = True, noexec: bool = False,
                   is_dir: bool | None = None, recursive: bool = False,
                   private: bool = False) -> None:
        """Bind-mount trusted ``host_path`` onto ``container_path`` in the root.

        The target (an empty file or a directory, matching the source) is
        created if missing; an existing target is used if it resolves inside
        the root to the same kind. The mount goes onto /proc/self/fd/<fd> of
        the resolved target, is checked to show the source's inode at
        ``container_path``, then remounted with the requested flags (on the
        top mount, as runc does). Submounts of the source come along only
        with ``recursive`` (``rbind``); ``private`` (``rprivate``) makes the
        new mounts propagate nowhere.
        """
        rel = normalize(container_path)
        try:
            src = os.open(host_path, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            raise ContainerError(f"bind mount source {host_path}: {e.strerror}") from None
        try:
            src_dir = stat.S_ISDIR(os.fstat(src).st_mode)
            if is_dir is not None and is_dir != src_dir:
                raise ContainerError(f"bind mount source {host_path}: "
                                     f"{'not ' if is_dir else ''}a directory")
            self._mount_onto(
                rel, src_dir,
                lambda target: mount(procfd(src), procfd(target), None,
                                     MS_BIND | (MS_REC if recursive else 0)),
                _same_inode(src), _bind_flags(readonly, nosuid, nodev, noexec),
                MS_PRIVATE | MS_REC if private else 0)
        except OSError as e:
            raise self._fail(rel, e) from None
        finally:
            os.close(src)

    def remount_read_only(self) -> None:
        """Make the root's own mount read-only, keeping its nosuid/nodev/noexec (as runc does).

        For a spec's ``root.readonly`` under runtimes that apply it before the
        createContainer hooks (crun): the shim moves it to the end of nvct's
        hook chain. The root must be a mount of its own (both runtimes bind it
        onto itself); otherwise, or if the mount still reads writable, this
        fails rather than leave a read-only container writable.
        """
        kept = os.statvfs(self._fd).f_flag & (os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC)
        try:
            mount(None, procfd(self._fd), None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)
        except OSError as e:
            raise ContainerError(f"container root {self.path}: cannot make it read-only: "
                                 f"{e.strerror}") from None
        if not os.statvfs(self._fd).f_flag & os.ST_RDONLY:
            raise ContainerError(f"container root {self.path}: still writable after the "
                                 "read-only remount")

    def mount_data(self, container_path: str, data: bytes | str, mode: int = 0o444) -> None:
        """Show ``data`` as the file ``container_path`` (read-only, nosuid, nodev, noexec).

        For masking a file, e.g. the driver's /proc/driver/nvidia/params. The
        content lives in a private tmpfs that is never attached anywhere but
        on the target (fsopen/fsmount/open_tree/move_mount, Linux 5.2+), so no
        host path is used at all.
        """
        if isinstance(data, str):
            data = data.encode()
        rel = normalize(container_path)
        try:
            tree = _detached_file(data, mode)
            try:
                self._mount_onto(
                    rel, False,
                    lambda target: _move_mount(tree, target),
                    _same_inode(tree), _bind_flags(True, True, True, True))
            finally:
                os.close(tree)
        except OSError as e:
            raise self._fail(rel, e) from None

    def mount_tmpfs(self, container_path: str, options: str = "", *, nosuid: bool = True,
                    nodev: bool = True, noexec: bool = True) -> None:
        """Mount a fresh tmpfs on ``container_path`` (a directory, created if missing).

        ``options`` is tmpfs's data string, e.g. ``"size=1m,mode=0755"``.
        """
        rel = normalize(container_path)
        flags = _bind_flags(False, nosuid, nodev, noexec)
        try:
            self._mount_onto(
                rel, True,
                lambda target: mount("tmpfs", procfd(target), "tmpfs", flags, options or None),
                lambda before, fresh: (os.fstat(fresh).st_dev != os.fstat(before).st_dev
                                       and fs_type(fresh) == TMPFS_MAGIC))
        except OSError as e:
            raise self._fail(rel, e) from None

    def _mount_onto(self, rel: str, directory: bool, do_mount, landed,
                    remount: int | None = None, propagation: int = 0) -> None:
        """Mount onto the resolved target of ``rel``, then check ``rel`` shows it.

        ``do_mount(target_fd)`` mounts; ``landed(target_fd, fresh_fd)`` tells
        whether a fresh resolution of ``rel`` is the new mount. If not (the
        tree changed under us), or the remount with the final flags or the
        ``propagation`` change fails, the mount is detached again.
        """
        target = self._mount_target(rel, directory)
        try:
            do_mount(target)
            try:
                try:
                    fresh = self._resolve(rel)
                except OSError:
                    fresh = -1
                try:
                    if fresh < 0 or not landed(target, fresh):
                        raise ContainerError(
                            f"{self._show(rel)}: changed while mounting; mount undone")
                    if remount is not None:
                        mount(None, procfd(fresh), None, MS_BIND | MS_REMOUNT | remount)
                    if propagation:
                        mount(None, procfd(fresh), None, propagation)
                finally:
                    if fresh >= 0:
                        os.close(fresh)
            except BaseException:
                # umount's lookup crosses mounts on the last hop: this is ours.
                try:
                    umount(procfd(target), MNT_DETACH)
                except OSError:
                    pass  # the first error is the one to report
                raise
        finally:
            os.close(target)

    def _mount_target(self, rel: str, directory: bool) -> int:
        """Resolve (creating it if missing) a mount point of the right kind."""
        try:
            fd = self._resolve(rel)
        except FileNotFoundError:
            if directory:
                self._makedirs(rel, 0o755)
            else:
                parent, name = self._parent(rel, create=True)
                try:
                    self._checked(parent, rel)
                    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                     | os.O_CLOEXEC, 0o644, dir_fd=parent))
                except FileExistsError:
                    pass  # a dangling symlink: resolving it below fails
                finally:
                    os.close(parent)
            fd = self._resolve(rel)
        try:
            self._checked(fd, rel, named=True)
            if stat.S_ISDIR(os.fstat(fd).st_mode) != directory:
                raise ContainerError(
                    f"{self._show(rel)}: mount target is {'not ' if directory else ''}"
                    f"a directory but the source is{'' if directory else ' not'}")
        except BaseException:
            os.close(fd)
            raise
        return fd


def _bind_flags(readonly: bool, nosuid: bool, nodev: bool, noexec: bool) -> int:
    return ((MS_RDONLY if readonly else 0) | (MS_NOSUID if nosuid else 0)
            | (MS_NODEV if nodev else 0) | (MS_NOEXEC if noexec else 0))


def _same_inode(source: int):
    """A ``landed`` check: the fresh target shows ``source``'s inode."""
    src = os.fstat(source)

    def landed(_target: int, fresh: int) -> bool:
        st = os.fstat(fresh)
        return (st.st_dev, st.st_ino) == (src.st_dev, src.st_ino)

    return landed


# The new mount API (Linux 5.2+): same numbers on every architecture.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = (
    428, 429, 430, 431, 432)
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_FSOPEN_CLOEXEC = 1
_FSCONFIG_CMD_CREATE = 6
_FSMOUNT_CLOEXEC = 1
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV, _MOUNT_ATTR_NOEXEC = 0x2, 0x4, 0x8


def _syscall(number: int, *args) -> int:
    conv = [a if isinstance(a, (bytes, type(None))) else ctypes.c_long(a) for a in args]
    result = libc.syscall(ctypes.c_long(number), *conv)
    if result < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise OSError(err, "the new mount API (Linux 5.2+) is missing")
        raise oserror()
    return result


def _detached_file(data: bytes, mode: int) -> int:
    """A detached mount of one file holding ``data``, on a private tmpfs."""
    fs = _syscall(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC)
    try:
        _syscall(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        mnt = _syscall(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC,
                       _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | _MOUNT_ATTR_NOEXEC)
    finally:
        os.close(fs)
    try:
        fd = os.open("data", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                     dir_fd=mnt)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, stat.S_IMODE(mode))
        finally:
            os.close(fd)
        return _syscall(_SYS_OPEN_TREE, mnt, b"data", _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    finally:
        os.close(mnt)


def _move_mount(tree: int, target: int) -> None:
    _syscall(_SYS_MOVE_MOUNT, tree, b"", target, b"",
             _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH)
