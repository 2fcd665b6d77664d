"""Resolving paths inside a container root, from its one verified descriptor.

Every operation of :class:`nvct.rootfs.root.Rootfs` starts here: the root is
opened once (:func:`open_root`) and each path is resolved from that fd with
openat2(2) ``RESOLVE_IN_ROOT``, or by :meth:`_Resolver._walk` where the kernel
lacks it. Read nvct/rootfs/root.py's docstring for the threat.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from nvct.base.errors import ContainerError
from nvct.linux.fs import MAX_HOPS, PROC_SUPER_MAGIC, fs_type, mount_ns, open_no_symlinks, openat2, openat2_available

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

class UnsafeRootError(ContainerError):
    """A container root nvct will not write into: reached through a symlink, or not owned as a root."""


def open_root(path: str, owners: Sequence[int] = ()) -> int:
    """The container root at ``path``, opened once: an O_PATH fd on a verified directory.

    ``path`` is absolute and clean (``nvct.oci.spec.rootfs``). Refused with
    :class:`UnsafeRootError`: a symlink in any component (runc refuses such a
    root too, but only after nvct would have written through it), or a
    root not owned as an engine owns one: by root, by this process's user,
    or by a uid in ``owners`` (the host uid a spec maps to the container's
    root). A directory an unprivileged user owns could be one she swapped
    in, or one holding a mount point she moved there with it.
    """
    if not path.startswith("/") or "\0" in path:
        raise UnsafeRootError(f"container root {path!r}: not an absolute path")
    try:
        fd = open_no_symlinks(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeRootError(f"container root {path}: its path leads through a symlink "
                                  "(runc refuses such a root); refusing to write into it") from None
        if e.errno == errno.ENOTDIR:
            raise UnsafeRootError(f"container root {path}: not a directory") from None
        raise ContainerError(f"container root {path}: {e.strerror}") from None
    uid = os.fstat(fd).st_uid
    if uid != 0 and uid != os.geteuid() and uid not in owners:
        os.close(fd)
        raise UnsafeRootError(f"container root {path}: owned by uid {uid}, not by root or the "
                              "container's root user; refusing to write into it")
    return fd


def root_identity(path: str, owners: Sequence[int] = ()) -> tuple[int, int]:
    """(st_dev, st_ino) of the verified root at ``path`` (:func:`open_root`), for ``Rootfs(same_as=)``.

    Taken in the host's mount namespace, where only root can mount: in the
    container's, the runtime may have mounted another directory over the
    root's name (it resolved ``root.path`` while an owner had swapped it).
    """
    fd = open_root(path, owners)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino

def procfd(fd: int) -> str:
    """The magic link of our own ``fd``: the very inode, for calls that take no fd."""
    return f"/proc/self/fd/{fd}"


def normalize(path: str) -> str:
    """Container path -> path relative to the root ('.' for the root itself)."""
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise ContainerError(f"invalid container path {path!r}")
    rel = posixpath.normpath("/" + path).lstrip("/")
    return rel or "."


class _Resolver:
    """The verified root fd, and paths resolved from it (never from the root's name).

    ``same_as``: the root's :func:`root_identity` from the host's mount
    namespace; a root opened in the container's must be that very directory.
    """

    def __init__(self, root: str | os.PathLike[str], *, owners: Sequence[int] = (),
                 same_as: tuple[int, int] | None = None):
        self.path = os.fspath(root)
        self._fd = -1
        self._fd = open_root(self.path, owners)
        if same_as is not None:
            st = os.fstat(self._fd)
            if (st.st_dev, st.st_ino) != tuple(same_as):
                self.close()
                raise UnsafeRootError(f"container root {self.path}: the runtime set up another directory "
                                      "there than the one verified on the host (its path was swapped "
                                      "while the runtime resolved it); refusing to write into it")
        self._ns = mount_ns()

    def __enter__(self) -> _Resolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def fileno(self) -> int:
        """The root's O_PATH fd (valid until :meth:`close`)."""
        return self._fd

    def _resolve(self, rel: str, *, directory: bool = False) -> int:
        """O_PATH fd of ``rel``, all symlinks followed inside the root."""
        if mount_ns() != self._ns:
            # Paths would resolve in the old namespace's mount tree: a node
            # made there lands under the image's /dev, not the container's.
            raise ContainerError(f"container root {self.path} was opened in another "
                                 "mount namespace; open it after entering the container's")
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
        if rel == ".":
            return os.open(".", flags, dir_fd=self._fd)
        if openat2_available():
            return openat2(self._fd, rel, flags)
        fd = self._walk(rel)
        if directory and not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), rel)
        return fd

    def _walk(self, rel: str) -> int:
        """openat2's RESOLVE_IN_ROOT done by hand, one O_NOFOLLOW hop at a time.

        ".." pops back to the directory we came from and never above the root;
        a symlink's text is resolved from the root (absolute) or the current
        directory (relative); magic links (symlinks on procfs) are refused.
        """
        stack = [os.dup(self._fd)]
        todo = [p for p in reversed(rel.split("/")) if p not in ("", ".")]
        hops = 0
        try:
            while todo:
                part = todo.pop()
                if part == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                cur = stack[-1]
                fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
                mode = os.fstat(fd).st_mode
                if stat.S_ISLNK(mode):
                    hops += 1
                    if hops > MAX_HOPS or fs_type(cur) == PROC_SUPER_MAGIC:
                        os.close(fd)
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
                    try:
                        target = os.readlink("", dir_fd=fd)  # this very link
                    finally:
                        os.close(fd)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                    todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                    continue
                if todo and not stat.S_ISDIR(mode):
                    os.close(fd)
                    raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), rel)
                stack.append(fd)
            return stack.pop()
        finally:
            for fd in stack:
                os.close(fd)

    def _inside(self, fd: int, rel: str) -> str:
        """Where the resolved ``fd`` is, as an absolute path inside the root."""
        real = os.readlink(procfd(fd))
        top = os.readlink(procfd(self._fd))
        if real == top:
            return "/"
        prefix = top.rstrip("/") + "/"
        if not real.startswith(prefix):
            raise ContainerError(f"{self._show(rel)}: resolves outside the root ({real})")
        return "/" + real[len(prefix):]

    def _show(self, rel: str) -> str:
        return f"{'/' if rel == '.' else '/' + rel} in container root {self.path}"

    def _fail(self, rel: str, e: OSError) -> ContainerError:
        return ContainerError(f"{self._show(rel)}: {e.strerror or e}")
