"""Creating and changing files, directories, links and device nodes in a container root.

The last component is always made with an ``*at()`` call on its resolved
parent that never follows a symlink; a replaced file is written beside its
name and renamed over it, so an old symlink there is replaced, not followed.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from nvct.base.errors import ContainerError
from nvct.rootfs.guards import _Guards
from nvct.rootfs.resolve import normalize, procfd

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence


class _Files(_Guards):
    """Writes of files, directories, symlinks, nodes and attributes, each through a checked parent fd."""

    def _parent(self, rel: str, *, create: bool) -> tuple[int, str]:
        """(O_PATH fd of the resolved parent directory, last component)."""
        if rel == ".":
            raise ContainerError("the container root itself cannot be created or replaced")
        parent, name = posixpath.split(rel)
        parent = parent or "."
        if create:
            self._makedirs(parent, 0o755)
        fd = self._resolve(parent, directory=True)
        try:
            self._check_mount(fd, parent, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """Create ``path`` and missing parents (new ones get ``mode`` exactly).

        An existing directory, or a symlink resolving to one inside the root,
        is fine. A dangling symlink or a non-directory is an error.
        """
        rel = normalize(path)
        try:
            self._makedirs(rel, mode)
        except OSError as e:
            raise self._fail(rel, e) from None

    def _makedirs(self, rel: str, mode: int) -> None:
        try:
            os.close(self._resolve(rel, directory=True))
            return
        except FileNotFoundError:
            pass
        except NotADirectoryError:
            try:
                os.close(self._resolve(rel))
            except OSError:
                pass  # a parent is the culprit: creating it says which
            else:
                raise ContainerError(
                    f"{self._show(rel)}: exists and is not a directory") from None
        parent, name = self._parent(rel, create=True)
        try:
            self._checked(parent, rel)
            try:
                os.mkdir(name, mode, dir_fd=parent)
            except FileExistsError:
                # Another start on this root made it since we looked: fine if it is
                # a directory (or resolves to one) now.
                try:
                    os.close(self._resolve(rel, directory=True))
                    return
                except OSError:
                    pass
                raise ContainerError(
                    f"{self._show(rel)}: exists but does not resolve to a directory "
                    "(dangling symlink?)") from None
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=parent)
            try:
                os.fchmod(fd, mode)  # mkdir's mode went through the umask
            finally:
                os.close(fd)
        finally:
            os.close(parent)

    def mknod(self, path: str, kind: str, major: int, minor: int, mode: int = 0o666,
              uid: int | None = None, gid: int | None = None) -> None:
        """Create a device node (``kind`` 'c' or 'b'); parents are created.

        Idempotent: the same node already there only gets ``mode``/owner set.
        Anything else at ``path`` (a file, a symlink, another device) is an
        error: it is never replaced, since an image shipping it is broken or
        hostile and silently deleting image content hides that.
        """
        if kind not in ("c", "b"):
            raise ContainerError(f"device node {path}: type {kind!r} is not 'c' or 'b'")
        ftype = stat.S_IFCHR if kind == "c" else stat.S_IFBLK
        rdev = os.makedev(major, minor)
        rel = normalize(path)
        try:
            parent, name = self._parent(rel, create=True)
            try:
                self._checked(parent, rel)
                try:
                    os.mknod(name, ftype | 0o600, rdev, dir_fd=parent)
                except FileExistsError:
                    pass
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            finally:
                os.close(parent)
            try:
                st = os.fstat(fd)
                if stat.S_IFMT(st.st_mode) != ftype or st.st_rdev != rdev:
                    raise ContainerError(
                        f"{self._show(rel)}: already exists and is not device {kind} "
                        f"{major}:{minor}; refusing to replace it")
                self._chmod_chown(fd, mode, uid, gid)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._fail(rel, e) from None

    def chmod(self, path: str, mode: int) -> None:
        """Set the mode of what ``path`` resolves to (symlinks followed in-root)."""
        self._set_attrs(normalize(path), mode, None, None)

    def chown(self, path: str, uid: int | None = None, gid: int | None = None) -> None:
        """Set the owner of what ``path`` resolves to; ``None`` leaves it as is."""
        self._set_attrs(normalize(path), None, uid, gid)

    def _set_attrs(self, rel: str, mode: int | None, uid: int | None,
                   gid: int | None) -> None:
        try:
            if rel != ".":
                os.close(self._parent(rel, create=False)[0])  # not via a symlink onto another mount
            fd = self._resolve(rel)
            try:
                self._checked(fd, rel)
                self._chmod_chown(fd, mode, uid, gid)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._fail(rel, e) from None

    @staticmethod
    def _chmod_chown(fd: int, mode: int | None, uid: int | None, gid: int | None) -> None:
        # fchmod/fchown refuse O_PATH fds; /proc/self/fd/N is the very inode.
        if uid is not None or gid is not None:
            os.chown(procfd(fd), -1 if uid is None else uid, -1 if gid is None else gid)
        if mode is not None:
            os.chmod(procfd(fd), stat.S_IMODE(mode))

    def symlink(self, target: str, linkpath: str, *, replace: bool = False) -> None:
        """Create ``linkpath`` -> ``target`` (text stored as given).

        An identical link already there is fine. Anything else there is an
        error, or with ``replace=True`` is atomically replaced (renameat never
        follows the old entry; a directory is never replaced).
        """
        self.symlinks([(target, linkpath)], replace=replace)

    def symlinks(self, links: Sequence[tuple[str, str]], *, replace: bool = False) -> None:
        """:meth:`symlink` for each ``(target, linkpath)``, in order; each folder resolved once.

        The links of one folder are all made through the one fd that folder
        resolved to, with the same checks as a single link.
        """
        parents: dict[str, int] = {}
        try:
            for target, linkpath in links:
                rel = normalize(linkpath)
                folder, name = posixpath.split(rel)
                try:
                    if folder not in parents:
                        parents[folder] = self._parent(rel, create=True)[0]
                    parent = parents[folder]
                    self._checked(parent, rel)
                    self._link(parent, name, target, rel, replace)
                except OSError as e:
                    raise self._fail(rel, e) from None
        finally:
            for fd in parents.values():
                os.close(fd)

    def _link(self, parent: int, name: str, target: str, rel: str, replace: bool) -> None:
        try:
            os.symlink(target, name, dir_fd=parent)
            return
        except FileExistsError:
            pass
        try:
            current: str | None = os.readlink(name, dir_fd=parent)
        except OSError:
            current = None
        if current == target:
            return
        if not replace:
            what = f"a symlink to {current}" if current is not None else "not a symlink"
            raise ContainerError(f"{self._show(rel)}: already exists ({what})")
        self._replace(parent, name, lambda tmp: os.symlink(target, tmp, dir_fd=parent))

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644, *,
                   replace: bool = False, sweep: bool = False) -> None:
        """Create a regular file with ``data`` (parents created).

        Without ``replace`` the file must not exist (O_CREAT|O_EXCL|O_NOFOLLOW).
        With it, the content goes to a fresh temporary file renamed over
        ``path``: an old symlink there is replaced, never followed. The
        temporary is removed on any failure; ``sweep`` also removes those a
        killed earlier write left (only for callers that serialize writes of
        ``path``, e.g. under a lock: another writer's would go too).
        """
        if isinstance(data, str):
            data = data.encode()
        rel = normalize(path)

        def create(name: str) -> None:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=parent)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
            finally:
                os.close(fd)

        try:
            parent, name = self._parent(rel, create=True)
            try:
                self._checked(parent, rel)
                if replace:
                    if sweep:
                        _sweep(parent, name)
                    self._replace(parent, name, create)
                else:
                    try:
                        create(name)
                    except FileExistsError:
                        raise ContainerError(f"{self._show(rel)}: already exists") from None
            finally:
                os.close(parent)
        except OSError as e:
            raise self._fail(rel, e) from None

    @staticmethod
    def _replace(parent: int, name: str, create) -> None:
        tmp = f"{_tmp_prefix(name)}{os.urandom(6).hex()}"
        try:
            create(tmp)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)  # made, then the write failed (ENOSPC, ...)
            except OSError:
                pass
            raise
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
        except FileNotFoundError:
            pass
        except BaseException:
            os.unlink(tmp, dir_fd=parent)
            raise
        try:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            os.unlink(tmp, dir_fd=parent)
            raise

def _tmp_prefix(name: str) -> str:
    """Temporaries of ``name`` are ``<prefix><12 hex digits>``, beside it."""
    return f".{name[:200]}.nvct-"


def _sweep(parent: int, name: str) -> None:
    """Remove the temporaries of ``name`` in ``parent`` that a killed write left behind."""
    prefix = _tmp_prefix(name)
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
    try:
        stale = [n for n in os.listdir(fd) if n.startswith(prefix) and len(n) == len(prefix) + 12
                 and all(c in "0123456789abcdef" for c in n[len(prefix):])]
    finally:
        os.close(fd)
    for tmp in stale:
        try:
            os.unlink(tmp, dir_fd=parent)  # never follows: a link or a file goes, a directory stays
        except OSError:
            pass
