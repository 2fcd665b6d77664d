"""Mount namespaces: entering a container's, or a private one, in a child.

A prestart hook runs in the host's mount namespace, but the container's
mounts (its /dev tmpfs, /proc, our bind mounts) live in the container's. Edits
must be realized there. setns(CLONE_NEWNS) also moves the caller's root and
cwd and fails in multi-threaded processes, so the work runs in a forked child
and only its result (or a one-line error) comes back: the hook itself never
changes namespace.
"""

from __future__ import annotations

import ctypes
import os
import sys

from nvct.base.errors import ContainerError, NvctError
from nvct.linux.fs import MS_PRIVATE, MS_REC, mount
from nvct.linux.libc import libc as _libc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

CLONE_NEWNS = 0x00020000


class MountInfo(tuple):
    """One line of /proc/<pid>/mountinfo, as a tuple (hashable, ordered).

    ``root`` is the path inside its filesystem that is mounted at ``mount_point``.
    Written out by hand: collections.namedtuple costs every hook start ~2 ms of imports.
    """

    __slots__ = ()

    def __new__(cls, mount_point: str, root: str, fstype: str, source: str,
                super_options: tuple[str, ...]) -> MountInfo:
        return tuple.__new__(cls, (mount_point, root, fstype, source, super_options))

    def __getnewargs__(self) -> tuple:  # pickling (results cross a fork)
        return tuple(self)

    mount_point = property(lambda self: self[0])
    root = property(lambda self: self[1])
    fstype = property(lambda self: self[2])
    source = property(lambda self: self[3])
    super_options = property(lambda self: self[4])

    def __repr__(self) -> str:
        return (f"MountInfo(mount_point={self[0]!r}, root={self[1]!r}, fstype={self[2]!r}, "
                f"source={self[3]!r}, super_options={self[4]!r})")


def mounts(pid: int | str = "self") -> Iterator[MountInfo]:
    """The mounts seen by ``pid`` (default: this process), in mountinfo order."""
    with open(f"/proc/{pid}/mountinfo", "rb") as f:
        for raw in f:
            fields = raw.decode("utf-8", "surrogateescape").split(" ")
            sep = fields.index("-")
            yield MountInfo(_unescape(fields[4]), _unescape(fields[3]), fields[sep + 1],
                            _unescape(fields[sep + 2]),
                            tuple(fields[sep + 3].rstrip("\n").split(",")))


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as \ooo.
    if "\\" not in field:
        return field
    out, i, raw = bytearray(), 0, field.encode("utf-8", "surrogateescape")
    while i < len(raw):
        if raw[i] == 0x5C and raw[i + 1:i + 4].isdigit() and len(raw[i + 1:i + 4]) == 3:
            out.append(int(raw[i + 1:i + 4], 8) & 0xFF)
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def mount_namespace_id(pid: int | str = "self") -> tuple[int, int]:
    """(st_dev, st_ino) of ``pid``'s mount namespace: equal ids, same namespace."""
    try:
        st = os.stat(f"/proc/{pid}/ns/mnt")
    except OSError as e:
        raise ContainerError(f"mount namespace of pid {pid}: {e.strerror}") from None
    return st.st_dev, st.st_ino


def in_same_mount_namespace(pid: int) -> bool:
    """Whether this process already is in ``pid``'s mount namespace."""
    return mount_namespace_id() == mount_namespace_id(pid)


def enter_mount_namespace(pid: int) -> None:
    """setns(2) this process into ``pid``'s mount namespace.

    Changes this process's root and cwd for good; prefer
    :func:`in_mount_namespace_of`. Fails in a multi-threaded process. A
    no-op when already there (e.g. a createContainer hook).
    """
    if in_same_mount_namespace(pid):
        return
    try:
        fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ContainerError(f"mount namespace of pid {pid}: {e.strerror}") from None
    try:
        if _libc.setns(fd, CLONE_NEWNS):
            err = ctypes.get_errno()
            raise ContainerError(f"cannot enter the mount namespace of pid {pid}: "
                                 f"{os.strerror(err)}")
    finally:
        os.close(fd)


def unshare_mount_namespace() -> None:
    """Move this process into a new, private mount namespace.

    Everything is made recursively private first, so mounts and unmounts
    done afterwards never propagate back to the namespace we came from.
    """
    if _libc.unshare(CLONE_NEWNS):
        err = ctypes.get_errno()
        raise ContainerError(f"cannot create a mount namespace: {os.strerror(err)}")
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as e:
        raise ContainerError(f"cannot make mounts private: {e.strerror}") from None


def in_mount_namespace_of(pid: int, func: Callable[..., Any], *args: Any,
                          **kwargs: Any) -> Any:
    """Run ``func(*args, **kwargs)`` in a child inside ``pid``'s mount namespace.

    Returns func's result; an exception in the child is raised here as the
    same :class:`NvctError` subclass, or as a one-line ContainerError.
    """
    return run_in_child(lambda: enter_mount_namespace(pid), func, *args, **kwargs)


def in_private_mount_namespace(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Like :func:`in_mount_namespace_of`, in a fresh private mount namespace."""
    return run_in_child(unshare_mount_namespace, func, *args, **kwargs)


def run_in_child(prepare: Callable[[], None] | None, func: Callable[..., Any], *args: Any,
                 **kwargs: Any) -> Any:
    """Fork; in the child run ``prepare()`` then ``func(...)``; return its result.

    The result must pickle. The child never returns into the caller's code:
    it always ends with os._exit. A ``None`` result (the legacy hook's) comes
    back as one byte, so a start imports no pickle.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(rfd)
            try:
                if prepare is not None:
                    prepare()
                payload = ("ok", func(*args, **kwargs))
            except NvctError as e:
                payload = ("err", e)
            except BaseException as e:  # noqa: BLE001 - everything goes back as one line
                payload = ("err", ContainerError(_one_line(e)))
            data = _NONE if payload[0] == "ok" and payload[1] is None else _pickled(payload)
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view):]
        except BaseException:  # noqa: BLE001 - the child exits 1, whatever happened
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        chunks = []
        while True:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        raise ContainerError(f"helper process failed ({_describe_status(status)})")
    data = b"".join(chunks)
    if data == _NONE:
        return None
    import pickle

    kind, value = pickle.loads(data)
    if kind == "err":
        raise value
    return value


_NONE = b"\0"  # never a pickle, which starts with its protocol opcode


def _pickled(payload: tuple) -> bytes:
    import pickle

    try:
        return pickle.dumps(payload)
    except Exception as e:  # noqa: BLE001 - whatever does not pickle goes back as one line
        return pickle.dumps(("err", ContainerError(f"result does not pickle: {e}")))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    name = type(e).__name__
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return f"{name}: {text}" if text else name


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"
