"""The params mask: ``ModifyDeviceFiles: 0`` over the driver's /proc file, and where a /proc mask may go."""

from __future__ import annotations

import os

from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.hooks.container import HookContext

#: The driver's params, masked in every GPU container.
PARAMS = "/proc/driver/nvidia/params"


def disable_device_node_modification(step: kinds.MaskParams, ctx: HookContext) -> None:
    """Mask the driver's params with ``ModifyDeviceFiles: 0`` so libcuda never mknods in the container.

    Only the kernel's file (:func:`kernel_proc_path`); a volume under /proc is refused first.
    """
    from nvct.rootfs import mounttargets

    mounttargets.check_proc(ctx.spec, ctx.rootfs)
    root = ctx.root
    if not kernel_proc_path(root, PARAMS):
        return
    masked = masked_params(root.read_file(PARAMS))
    if masked is not None:
        root.mount_data(PARAMS, masked)


def kernel_proc_path(root, path: str) -> bool:
    """Whether ``path`` (under /proc) is there and is the kernel's: where a mask may go.

    The one rule for every mask nvct mounts under /proc (the chain's step, which the shim
    leaves to the hook, and legacy's view of /proc/driver/nvidia): every component from the root down is opened without
    following a link, and the last is on procfs, or is the very file this process
    sees at ``path`` (a simulated node's /proc/driver, a plain directory). False
    when it is not there; ContainerError for anything else (a link, a volume):
    a mask there would cover that file, and through a shared mount the host's.
    """
    import stat

    from nvct.base.errors import ContainerError
    from nvct.linux.fs import PROC_SUPER_MAGIC, fs_type

    fd = os.dup(root.fileno())
    try:
        for part in path.strip("/").split("/"):
            try:
                nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return False
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise ContainerError(f"{path} in container root {root.path}: reached through a symlink; "
                                     "refusing to mask it")
        if fs_type(fd) == PROC_SUPER_MAGIC:
            return True
        try:
            own = os.stat(path)
        except OSError:
            own = None
        if own is not None and (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            return True
        raise ContainerError(f"{path} in container root {root.path}: not on the kernel's procfs (a volume?); "
                             "refusing to mask it")
    finally:
        os.close(fd)


def masked_params(current: bytes) -> bytes | None:
    """The driver's params with ``ModifyDeviceFiles: 0``; None when they say so already."""
    text = current.decode(errors="replace")
    if "ModifyDeviceFiles: 0" in text:
        return None
    lines = [("ModifyDeviceFiles: 0" if line.startswith("ModifyDeviceFiles:") else line)
             for line in text.splitlines()]
    return ("\n".join(lines) + "\n").encode()
