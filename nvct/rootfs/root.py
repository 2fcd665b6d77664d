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
  literally (see nvct.rootfs.guards). Bind mounts of host
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

from nvct.rootfs.mounts import _Mounts
from nvct.rootfs.reads import _Reads
from nvct.rootfs.resolve import UnsafeRootError, open_root, root_identity

__all__ = ["Rootfs", "UnsafeRootError", "open_root", "root_identity"]


class Rootfs(_Mounts, _Reads):
    """A container root, opened once; every operation stays inside it.

    Use as a context manager (``with Rootfs(path) as root: ...``); the root fd
    is closed on exit. Errors are :class:`ContainerError` naming the path.
    The root is opened by :func:`open_root` (``owners``: see there); hand the
    object itself to whatever else writes, never its path. ``same_as``: the
    root's :func:`root_identity` from the host's mount namespace; a root
    opened in the container's must be that very directory.

    Its parts, one concern each, all on the one verified fd: resolving paths
    (nvct.rootfs.resolve), the checks every write passes (guards), reads
    (reads), creating files, links and nodes (files), and mounts (mounts).
    """
