"""The file steps: links, modes and the driver's application profile, written through the Rootfs."""

from __future__ import annotations

import os
import sys

from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.hooks.container import HookContext


def create_symlinks(step: kinds.CreateSymlinks, ctx: HookContext) -> None:
    """``--link target::linkpath``: the SONAME and dev links of the driver libraries.

    As ``ln -sf`` (the reference's rule): whatever the image has at a link path
    (a stub's ``libcuda.so.1``, a stale link) is replaced, or the container would
    load the image's copy or fail to start. Replacing works through the Rootfs,
    inside the root and on the mount the path names (never a directory).
    """
    if step.links:
        ctx.root.symlinks(list(step.links), replace=True)


def chmod(step: kinds.Chmod, ctx: HookContext) -> None:
    """``--mode`` (octal, checked by the parser) on each ``--path``: e.g. device dirs that runc made 0700."""
    mode = int(step.mode, 8)
    root = ctx.root
    for path in step.paths:
        if root.exists(path):
            root.chmod(path, mode)


_PROFILE_DIR = "/etc/nvidia/nvidia-application-profiles-rc.d"
_PROFILE_FILE = _PROFILE_DIR + "/10-container.conf"


def update_application_profile(step: kinds.UpdateApplicationProfile, ctx: HookContext) -> None:
    """Limit EGL/Vulkan to the container's GPUs: ``EGLVisibleDGPUDevices`` = a mask of its
    ``/dev/nvidiaN`` minors, in a driver application profile (the reference's hook of that name)."""
    import stat

    root = ctx.root
    if not root.exists("/dev"):
        return
    fd = root.open("/dev")
    try:
        mask = 0
        for name in os.listdir(fd):
            if not (name.startswith("nvidia") and name[6:].isdigit() and name[6:].isascii()):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            minor = os.minor(st.st_rdev)
            if stat.S_ISCHR(st.st_mode) and minor < 64:
                mask |= 1 << minor
    finally:
        os.close(fd)
    if not mask:
        return
    # /etc/nvidia is often a read-only volume (the device plugin's ConfigMap):
    # a start must not fail for a profile (the reference's 1.20.0 did; fixed since).
    existing = next(p for p in (_PROFILE_DIR, "/etc/nvidia", "/etc", "/") if root.exists(p))
    if root.is_read_only(existing):
        sys.stderr.write(f"update-application-profile: {existing} is read-only in the container; "
                         "EGL and Vulkan are not limited to its GPUs\n")
        return
    root.makedirs(_PROFILE_DIR, 0o555)
    profile = ('{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",%s]}],'
               '"rules":[{"pattern":[],"profile":"_container_"}]}' % hex(mask))
    root.write_file(_PROFILE_FILE, profile.encode(), 0o444, replace=True)
