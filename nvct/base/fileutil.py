"""Atomic file replacement that leaves nothing behind, and directories opened without links.

Config files and OCI specs are never written in place: a crash or a full disk
must leave either the old file or the new one, never half of either. The new
content is written into an unnamed file (``O_TMPFILE``), so a kill or a full
disk while writing leaves nothing; it gets a temporary name only for the two
system calls that put it in place (link, rename). A name left by a kill in
that window carries the writer's pid and is removed by the next write into the
same directory (:func:`sweep`).
"""

from __future__ import annotations

import os
import stat

#: Temporary names: ``.nvct-<pid>-<random>.tmp`` (also ``.nvct-<pid>.tmp``, the sh front's).
TMP_PREFIX, TMP_SUFFIX = ".nvct-", ".tmp"
#: A temporary file this old is stale even if its pid is alive again (reused).
_STALE_S = 3600


def write_atomic(path: str, data: bytes | str, *, mode: int | None = None,
                 backup: str | None = None, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically.

    The new file keeps the old file's mode and owner (or ``mode``, or 0644).
    When ``backup`` is given and ``path`` exists, the old content is copied
    there first (only once: an existing backup is the original and is kept).
    ``durable=False`` skips fsync, for files nobody needs after a crash (an
    OCI bundle's config.json).
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        st = os.stat(path)
        keep_mode = stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        st = None
        keep_mode = 0o644
    if backup and st is not None and not os.path.exists(backup):
        import shutil

        shutil.copy2(path, backup)
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_at(dir_fd, name, data, keep_mode if mode is None else mode, durable=durable,
                   owner=(st.st_uid, st.st_gid) if st is not None else None)
    finally:
        os.close(dir_fd)


def replace_at(dir_fd: int, name: str, data: bytes, mode: int = 0o600, *, durable: bool = False,
               owner: tuple[int, int] | None = None, mtime_ns: int | None = None) -> None:
    """Replace ``name`` in the directory ``dir_fd`` with ``data`` (``mode``; ``owner`` if given).

    Nothing is ever left under a temporary name once this returns or raises;
    a kill in between leaves one that :func:`sweep` (run here first) removes.
    """
    sweep(dir_fd)
    try:
        fd = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except (OSError, AttributeError):  # no O_TMPFILE here (an old kernel, some file systems)
        fd = None
    tmp = f"{TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}{TMP_SUFFIX}"
    named = False
    try:
        if fd is None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            named = True
        _fill(fd, data, mode, durable=durable, owner=owner, mtime_ns=mtime_ns)
        if not named:
            try:
                os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=dir_fd)
            except FileNotFoundError:  # no /proc: name it the old way
                os.close(fd)
                fd = None
                replace_named(dir_fd, tmp, name, data, mode, durable=durable, owner=owner, mtime_ns=mtime_ns)
                return
            named = True
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        named = False
    finally:
        if fd is not None:
            os.close(fd)
        if named:
            _unlink_at(dir_fd, tmp)


def replace_named(dir_fd: int, tmp: str, name: str, data: bytes, mode: int, *, durable: bool,
                  owner: tuple[int, int] | None, mtime_ns: int | None) -> None:
    """:func:`replace_at` through a named temporary file (where ``O_TMPFILE`` cannot be linked)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            _fill(fd, data, mode, durable=durable, owner=owner, mtime_ns=mtime_ns)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_at(dir_fd, tmp)
        raise


def _fill(fd: int, data: bytes, mode: int, *, durable: bool,
          owner: tuple[int, int] | None, mtime_ns: int | None) -> None:
    """Give the not yet named file ``fd`` its bytes, mode, owner and mtime (before it takes the name)."""
    _write_all(fd, data)
    if durable:
        os.fsync(fd)
    os.fchmod(fd, mode)
    if owner is not None:
        try:
            os.fchown(fd, *owner)
        except PermissionError:
            pass
    if mtime_ns is not None:
        os.utime(fd, ns=(mtime_ns, mtime_ns))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sweep(dir_fd: int) -> int:
    """Remove the temporary files of writers that are gone (their pid dead, or an hour old); how many."""
    removed = 0
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    for name in names:
        pid = temp_pid(name)
        if pid is None or pid == os.getpid():
            continue
        if _alive(pid):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            import time

            if time.time() - st.st_mtime < _STALE_S:
                continue
        if _unlink_at(dir_fd, name):
            removed += 1
    return removed


def temp_pid(name: str) -> int | None:
    """The writer's pid of a temporary name (``.nvct-<pid>[-...].tmp``, or an older ``<name>.<pid>.tmp``)."""
    if not name.endswith(TMP_SUFFIX):
        return None
    if name.startswith(TMP_PREFIX):
        digits = name[len(TMP_PREFIX):-len(TMP_SUFFIX)].partition("-")[0]
    else:
        digits = name[:-len(TMP_SUFFIX)].rpartition(".")[2]
    return int(digits) if digits.isdigit() and digits.isascii() and len(digits) < 10 else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone's
        return True
    return True


def remove_path(path: str) -> None:
    """Delete ``path``: a directory's whole tree, or the entry itself (a link is never followed).

    Already gone is fine, and so is what a tree removal cannot delete: callers
    clear their own directories, which a later run clears again.
    """
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _unlink_at(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def open_dir(path: str, *, create_mode: int | None = None) -> int:
    """``path`` (absolute) opened as a directory without following a symlink in any component.

    ``create_mode``: make the last component with this mode if it is missing.
    Raises OSError (ELOOP, ENOTDIR: a link or a file on the way).
    """
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            nxt = _open_child(fd, part, create_mode if i == len(parts) - 1 else None)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_private_dir(parent_fd: int, name: str, *, create: bool = True) -> int | None:
    """``name`` in ``parent_fd``, not followed if a link, made 0700 if missing; ``None`` unless it is
    a directory of ours that nobody else may write."""
    try:
        fd = _open_child(parent_fd, name, 0o700 if create else None)
    except OSError:
        return None
    if private(os.fstat(fd)):
        return fd
    os.close(fd)
    return None


def private(st: os.stat_result) -> bool:
    """A directory of this user's that no one else may write."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_child(dir_fd: int, name: str, create_mode: int | None) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        if create_mode is None:
            raise
    try:
        os.mkdir(name, create_mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return os.open(name, flags, dir_fd=dir_fd)


class Staged:
    """New content for ``path``, written and named beside it, put in place by :meth:`commit`.

    For a file that must be saved together with writes elsewhere (the shim's
    config.json and the container root): every block the file needs is
    allocated here, so a full disk fails before the other writes, and
    :meth:`commit` is one rename. A kill before it leaves a temporary name
    that the next write into the directory removes (:func:`sweep`).
    """

    def __init__(self, path: str, data: bytes, mode: int | None = None):
        directory, self._name = os.path.split(os.path.abspath(path))
        self._dir = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._tmp: str | None = None
        try:
            try:
                st = os.stat(self._name, dir_fd=self._dir)
                keep, owner = stat.S_IMODE(st.st_mode), (st.st_uid, st.st_gid)
            except FileNotFoundError:
                keep, owner = 0o644, None
            sweep(self._dir)
            tmp = f"{TMP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}{TMP_SUFFIX}"
            try:  # unnamed while written: a kill leaves no half-written file
                fd, named = os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o600, dir_fd=self._dir), False
            except (OSError, AttributeError):
                fd, named = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                    0o600, dir_fd=self._dir), True
                self._tmp = tmp
            try:
                _write_all(fd, data)
                os.fchmod(fd, keep if mode is None else mode)
                if owner is not None:
                    try:
                        os.fchown(fd, *owner)
                    except PermissionError:
                        pass
                if not named:
                    os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=self._dir)
                    self._tmp = tmp
            finally:
                os.close(fd)
        except BaseException:
            self.discard()
            raise

    def commit(self) -> None:
        assert self._tmp is not None, "commit after commit or discard"
        try:
            os.rename(self._tmp, self._name, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            self._tmp = None
        finally:
            self.discard()

    def discard(self) -> None:
        """Forget the new content (a failure elsewhere): ``path`` stays as it was."""
        if self._tmp is not None:
            _unlink_at(self._dir, self._tmp)
            self._tmp = None
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1
