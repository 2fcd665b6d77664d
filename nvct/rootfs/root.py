"""Safe file operations inside a container's root filesystem.

The image is hostile: any path component inside it may be a symlink (absolute,
relative, or swapped while we work) meant to make a privileged hook create,
change or mount something on the host (CVE-2024-0132, -0133, -0134). So no
operation here ever passes a joined ``root + path`` string to the kernel:

* every path is resolved from an ``O_PATH`` fd on the root with openat2(2) and
  ``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`` (symlinks are followed but
  clamped to the root; ``/proc/*/root``-style magic links are refused), or, on
  kernels without openat2, by a component-by-component walk that does the same;
* the last component is created with ``*at()`` calls on the resolved parent fd
  that never follow a symlink (``mkdirat``, ``mknodat``, ``symlinkat``,
  ``O_CREAT|O_EXCL|O_NOFOLLOW``, ``renameat``);
* mounts, chmod and chown act on ``/proc/self/fd/<fd>`` of an fd we resolved,
  so there is no window between checking a path and using it; a mount is
  checked afterwards to be where the path leads, and undone if not;
* nothing is created or changed on procfs, sysfs and the like, even inside
  the root (their files act on the host kernel); reading or mounting over
  them only at the exact path the caller named, never via an image symlink;
* nothing is created or changed in a directory that an image symlink moved
  onto another mount: the directory must be on the mount its path names
  literally (see :meth:`Rootfs._check_mount`). Bind mounts of host
  directories (the read-write MPS pipe dir, volumes) are thus never written
  through a planted ``/usr/lib/x86_64-linux-gnu -> /tmp/nvidia-mps``.

The root itself is opened once (:func:`open_root`): its path may follow no
symlink in any component (runc's own rule), and it must be a directory owned
as an engine owns a root. Every operation then starts from that one fd, so
a user who controls a directory above the root (``podman --rootfs ~/rootfs``)
cannot swap the root for a link to a host directory between two steps.

Open a Rootfs only after entering the container's mount namespace (see
nvct.linux.namespaces): operations refuse to run from another one.

The container's own view (symlinks resolved inside the root) is honoured:
``/lib -> usr/lib`` works, ``/usr/lib/x86_64-linux-gnu -> /etc`` lands in the
root's ``/etc``, never the host's.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat

from nvct.base.errors import ContainerError
from nvct.linux.libc import libc
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
    PROC_SUPER_MAGIC,
    TMPFS_MAGIC,
    MAX_HOPS,
    PSEUDO_FS,
    mount_ns,
    openat2,
    oserror,
    fs_type,
    mount,
    mount_id,
    open_no_symlinks,
    openat2_available,
    umount,
)

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


def _procfd(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def _normalize(path: str) -> str:
    """Container path -> path relative to the root ('.' for the root itself)."""
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise ContainerError(f"invalid container path {path!r}")
    rel = posixpath.normpath("/" + path).lstrip("/")
    return rel or "."


class Rootfs:
    """A container root, opened once; every operation stays inside it.

    Use as a context manager (``with Rootfs(path) as root: ...``); the root fd
    is closed on exit. Errors are :class:`ContainerError` naming the path.
    The root is opened by :func:`open_root` (``owners``: see there); hand the
    object itself to whatever else writes, never its path. ``same_as``: the
    root's :func:`root_identity` from the host's mount namespace; a root
    opened in the container's must be that very directory.
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
        self._literal_mounts: dict[str, int] = {}

    def __enter__(self) -> Rootfs:
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

    # -- resolution -----------------------------------------------------

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

    def _check_mount(self, fd: int, parent: str, rel: str) -> None:
        """Refuse when ``fd`` (``parent`` resolved) is on another mount than ``parent`` names.

        The expected mount is the one a walk of ``parent``'s components
        reaches without following any symlink (it stops at the first
        symlink or missing component). Mount points the path names itself
        (``/dev``, ``/proc/driver/nvidia/gpus``) are thus fine, while an
        image symlink cannot move a write onto a bind mount of a host
        directory, such as the read-write ``/tmp/nvidia-mps``. The
        expectation is cached per path: a later swap of a directory for a
        symlink still meets the mount seen first.
        """
        expected = self._literal_mounts.get(parent)
        if expected is None:
            expected = self._literal_mounts[parent] = self._literal_mount(parent)
        if mount_id(fd) != expected:
            where = self._inside(fd, rel)
            raise ContainerError(
                f"{self._show(rel)}: its directory leads through a symlink onto another "
                f"mount ({where}); refusing to create or change anything there")

    def _literal_mount(self, parent: str) -> int:
        """Mount id of the deepest directory of ``parent`` reached without following a symlink."""
        cur = os.dup(self._fd)
        try:
            for part in ([] if parent == "." else parent.split("/")):
                try:
                    nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
                except OSError:
                    break
                if not stat.S_ISDIR(os.fstat(nxt).st_mode):
                    os.close(nxt)
                    break
                os.close(cur)
                cur = nxt
            return mount_id(cur)
        finally:
            os.close(cur)

    def check_same_mount(self, path: str) -> None:
        """Raise ContainerError if ``path`` lies, through a symlink, on another mount than named.

        For directories handed to a program that writes in them (ldconfig's
        library folders): the same rule as every write here.
        """
        rel = _normalize(path)
        try:
            fd = self._resolve(rel, directory=True)
        except OSError as e:
            raise self._fail(rel, e) from None
        try:
            self._check_mount(fd, rel, rel)
        finally:
            os.close(fd)

    def _checked(self, fd: int, rel: str, *, named: bool = False) -> None:
        """Refuse procfs, sysfs and the like: their files act on the host kernel.

        With ``named``, reading and mounting over such a file is allowed when
        it is exactly the path asked for (no image symlink led there): the
        hook masking /proc/driver/nvidia/gpus names the path itself, while an
        image redirecting a library path to /proc/kmsg does not.
        """
        kind = PSEUDO_FS.get(fs_type(fd))
        if not kind or (named and self._inside(fd, rel) == ("/" if rel == "." else "/" + rel)):
            return
        how = " reached through a symlink" if named else ""
        raise ContainerError(f"{self._show(rel)}: on {kind}{how}, refusing to touch it")

    def _inside(self, fd: int, rel: str) -> str:
        """Where the resolved ``fd`` is, as an absolute path inside the root."""
        real = os.readlink(_procfd(fd))
        top = os.readlink(_procfd(self._fd))
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

    # -- queries ----------------------------------------------------------

    def exists(self, path: str) -> bool:
        """Whether ``path`` resolves (inside the root) to something."""
        try:
            os.close(self._resolve(_normalize(path)))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno == errno.ELOOP:
                return False
            raise self._fail(_normalize(path), e) from None
        return True

    def realpath(self, path: str) -> str:
        """Where ``path`` really is, as an absolute path inside the root."""
        rel = _normalize(path)
        try:
            fd = self._resolve(rel)
            try:
                return self._inside(fd, rel)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._fail(rel, e) from None

    def is_read_only(self, path: str = "/") -> bool:
        """Whether ``path`` resolves onto a read-only mount."""
        rel = _normalize(path)
        try:
            fd = self._resolve(rel)
            try:
                return bool(os.statvfs(fd).f_flag & os.ST_RDONLY)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._fail(rel, e) from None

    def open(self, path: str) -> int:
        """A read-only fd on a regular file or directory in the root.

        Never opens devices, FIFOs or sockets (opening those has side
        effects or blocks), nor files on procfs/sysfs unless ``path`` names
        them directly. The caller closes the fd.
        """
        rel = _normalize(path)
        try:
            fd = self._resolve(rel)
            try:
                self._checked(fd, rel, named=True)  # reading /proc/kmsg eats the host's log
                mode = os.fstat(fd).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise ContainerError(f"{self._show(rel)}: not a regular file or directory")
                return os.open(_procfd(fd), os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
            finally:
                os.close(fd)
        except OSError as e:
            raise self._fail(rel, e) from None

    def read_file(self, path: str, limit: int = 1 << 20) -> bytes:
        """Contents of a regular file in the root, at most ``limit`` bytes."""
        fd = self.open(path)
        try:
            chunks, size = [], 0
            while size < limit:
                chunk = os.read(fd, limit - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            return b"".join(chunks)
        except OSError as e:
            raise self._fail(_normalize(path), e) from None
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        """Names in a directory of the root."""
        fd = self.open(path)
        try:
            return os.listdir(fd)
        except OSError as e:
            raise self._fail(_normalize(path), e) from None
        finally:
            os.close(fd)

    # -- changes ----------------------------------------------------------

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        """Create ``path`` and missing parents (new ones get ``mode`` exactly).

        An existing directory, or a symlink resolving to one inside the root,
        is fine. A dangling symlink or a non-directory is an error.
        """
        rel = _normalize(path)
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
        rel = _normalize(path)
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
        self._set_attrs(_normalize(path), mode, None, None)

    def chown(self, path: str, uid: int | None = None, gid: int | None = None) -> None:
        """Set the owner of what ``path`` resolves to; ``None`` leaves it as is."""
        self._set_attrs(_normalize(path), None, uid, gid)

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
            os.chown(_procfd(fd), -1 if uid is None else uid, -1 if gid is None else gid)
        if mode is not None:
            os.chmod(_procfd(fd), stat.S_IMODE(mode))

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
                rel = _normalize(linkpath)
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
        rel = _normalize(path)

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

    # -- mounts -----------------------------------------------------------

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
        rel = _normalize(container_path)
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
                lambda target: mount(_procfd(src), _procfd(target), None,
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
            mount(None, _procfd(self._fd), None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)
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
        rel = _normalize(container_path)
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
        rel = _normalize(container_path)
        flags = _bind_flags(False, nosuid, nodev, noexec)
        try:
            self._mount_onto(
                rel, True,
                lambda target: mount("tmpfs", _procfd(target), "tmpfs", flags, options or None),
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
                        mount(None, _procfd(fresh), None, MS_BIND | MS_REMOUNT | remount)
                    if propagation:
                        mount(None, _procfd(fresh), None, propagation)
                finally:
                    if fresh >= 0:
                        os.close(fresh)
            except BaseException:
                # umount's lookup crosses mounts on the last hop: this is ours.
                try:
                    umount(_procfd(target), MNT_DETACH)
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
