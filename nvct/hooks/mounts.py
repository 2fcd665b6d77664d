"""The mount steps: a host path bind-mounted last, the root made read-only, CDI mount options."""

from __future__ import annotations

import os

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.hooks.container import HookContext


def bind_mount(step: kinds.BindMount, ctx: HookContext) -> None:
    """``--host-path H --container-path C [--options o,o]``: bind-mount a host path last.

    CDI consumers (podman, containerd, cri-o) sort a spec's mounts by depth,
    so a spec cannot keep a writable host directory (the MPS pipe dir) after
    the mounts an image symlink could lead into it: specs from ``nvct cdi
    generate`` mount it here instead, after every spec mount, through the
    Rootfs and its mount-boundary rule (docs/security.md).
    """
    import posixpath

    host, target = step.host_path, step.container_path
    for flag, path in (("--host-path", host), ("--container-path", target)):
        if not path.startswith("/"):
            raise NvctError(f"bind-mount: {flag} {path!r} is not an absolute path")
    flags = mount_flags(step.options, "bind-mount: --options")
    root = ctx.root
    # An existing target that an image symlink leads onto another mount (a volume
    # with shared propagation would carry our mount to the host) is refused too.
    probe = target if os.path.isdir(host) else posixpath.dirname(target)
    if root.exists(probe):
        root.check_same_mount(probe)
    root.bind_mount(host, target, **flags)


def readonly_root(step: kinds.ReadonlyRoot, ctx: HookContext) -> None:
    """Make the container's root read-only: the spec's ``root.readonly``, applied last.

    crun applies ``root.readonly`` before the createContainer hooks run, so no
    hook could create a link or the ld cache in a read-only container; the
    shim then leaves the root writable for the runtime and puts this step at
    the end of nvct's chain (runc applies it after the hooks itself).
    """
    ctx.root.remount_read_only()


#: Mount options a bind mount nvct makes understands, as ``Rootfs.bind_mount`` arguments.
_MOUNT_OPTIONS = {"ro": ("readonly", True), "rw": ("readonly", False), "nosuid": ("nosuid", True),
                  "nodev": ("nodev", True), "noexec": ("noexec", True), "bind": ("recursive", False),
                  "rbind": ("recursive", True), "private": ("private", False),
                  "rprivate": ("private", True)}


def mount_flags(options, what: str) -> dict[str, bool]:
    """CDI/OCI mount ``options`` -> keyword arguments of :meth:`nvct.rootfs.root.Rootfs.bind_mount`.

    Unlisted flags are off (suid, dev and exec allowed: say ``nosuid`` etc.), so a
    realized mount has exactly the options its edit names, as under runc.
    """
    out = {"readonly": False, "nosuid": False, "nodev": False, "noexec": False}
    for option in options:
        if not option:
            continue
        known = _MOUNT_OPTIONS.get(option)
        if known is None:
            raise NvctError(f"{what}: unknown mount option {option!r} "
                            f"(known: {', '.join(sorted(_MOUNT_OPTIONS))})")
        out[known[0]] = known[1]
    return out
