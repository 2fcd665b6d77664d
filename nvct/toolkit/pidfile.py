"""The installer's pid file: an flock that lets only one installer run on a node.

The file is locked before it is truncated, so a second instance never wipes
the pid of the one that holds it; the lock dies with the process, so a
killed installer leaves no stale lock (only a file the next one reuses).
"""

from __future__ import annotations

import fcntl
import os

from nvct.base.errors import NvctError


class PidFileLocked(NvctError):
    """Another installer holds the pid file."""


class PidFile:
    """``with PidFile(path): ...`` -- hold the lock, our pid in the file; removed on exit."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> "PidFile":
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o755, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise NvctError(f"{self.path}: cannot open the pid file: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise PidFileLocked(f"{self.path}: locked by another nvct toolkit install (pid {holder}); "
                                f"only one may run on a node") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the file (while still holding the lock), then drop the lock."""
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "PidFile":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
