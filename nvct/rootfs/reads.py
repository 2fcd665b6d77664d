"""Reading a container root: existence, real paths, files and directories.

Reads follow the image's symlinks inside the root, but never open a device,
FIFO or socket, nor a procfs file an image symlink led to (reading
``/proc/kmsg`` eats the host's log).
"""

from __future__ import annotations

import errno
import os
import stat

from nvct.base.errors import ContainerError
from nvct.rootfs.guards import _Guards
from nvct.rootfs.resolve import normalize, procfd


class _Reads(_Guards):
    """Queries and reads of paths in the root."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` resolves (inside the root) to something."""
        try:
            os.close(self._resolve(normalize(path)))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            if e.errno == errno.ELOOP:
                return False
            raise self._fail(normalize(path), e) from None
        return True

    def realpath(self, path: str) -> str:
        """Where ``path`` really is, as an absolute path inside the root."""
        rel = normalize(path)
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
        rel = normalize(path)
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
        rel = normalize(path)
        try:
            fd = self._resolve(rel)
            try:
                self._checked(fd, rel, named=True)  # reading /proc/kmsg eats the host's log
                mode = os.fstat(fd).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise ContainerError(f"{self._show(rel)}: not a regular file or directory")
                return os.open(procfd(fd), os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
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
            raise self._fail(normalize(path), e) from None
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        """Names in a directory of the root."""
        fd = self.open(path)
        try:
            return os.listdir(fd)
        except OSError as e:
            raise self._fail(normalize(path), e) from None
        finally:
            os.close(fd)
