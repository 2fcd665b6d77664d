"""The checks every write into a container root passes: same mount, no pseudo filesystem.

An image symlink may lead a write onto a bind mount of a host directory (the
read-write MPS pipe dir, a volume) or onto procfs/sysfs, whose files act on
the host kernel. These checks refuse both; see nvct/rootfs/root.py.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import ContainerError
from nvct.linux.fs import PSEUDO_FS, fs_type, mount_id
from nvct.rootfs.resolve import _Resolver, normalize


class _Guards(_Resolver):
    """Where a resolved fd may be written: on the mount its path names, off pseudo filesystems."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._literal_mounts: dict[str, int] = {}

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
        rel = normalize(path)
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
