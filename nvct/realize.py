"""Realize edits inside a running container's mount namespace (legacy mode).

The prestart hook runs on the host while the container waits before
pivot_root. It grants device access in the container's cgroup from the host,
then, in a child that joined the container's mount namespace, creates the
device nodes, bind-mounts the driver files, masks /proc/driver/nvidia, and
runs the same in-container steps a jit-cdi spec's hook would.
"""

from __future__ import annotations

import os

from nvct import injection
from nvct.driver import Driver
from nvct.edits import ContainerEdits, Mount, writable_last
from nvct.hooks.container import HookContext
from nvct.request import Request

#: Capabilities the hook keeps after start: mounts, nodes, setns, chroot for ldconfig, file access.
KEEP_CAPS = {
    "sys_admin", "mknod", "sys_chroot", "sys_ptrace", "chown", "fowner", "dac_override",
    "dac_read_search", "setfcap", "setpcap",
}


def legacy(request: Request, config, spec: dict, bundle: str | None, pid: int, *,
           rootfs: str | None = None, devbind: bool = True) -> ContainerEdits:
    """The legacy hook's work; ``nvidia-container-cli configure`` names ``rootfs`` instead of a bundle.

    ``devbind=False`` (configure's ``--no-devbind``) leaves the device nodes to
    the runtime's spec: only their cgroup access is granted.
    """
    from nvct import cgroups, modes, namespaces, ocispec, privileges

    if config.get("nvidia-container-cli.load-kmods"):
        from nvct import kmods

        kmods.load(config.proc_root, config.dev_root)
    driver = Driver.from_config(config)
    edits = injection.container_edits(request, driver, config)
    modes.check_requirements(request, driver, config)
    privileges.drop_capabilities(KEEP_CAPS)
    rootfs = rootfs or ocispec.rootfs(spec, bundle)
    if not config.get("nvidia-container-cli.no-cgroups"):
        cgroups.allow_devices(pid, [(d.type, d.major, d.minor, "rwm") for d in edits.device_nodes])
    visible = [g for g in injection.selection_for(request, driver, config).all_parents()]
    compat = config.get("nvidia-container-runtime.modes.legacy.cuda-compat-mode") != "disabled"
    namespaces.in_mount_namespace_of(pid, _inside, edits, rootfs, driver, visible, spec, bundle, devbind, compat)
    return edits


def _inside(edits: ContainerEdits, rootfs: str, driver: Driver, visible, spec, bundle, devbind=True,
            compat=True) -> None:
    from nvct.hooks import steps
    from nvct.rootfs import Rootfs

    with Rootfs(rootfs) as root:
        for node in edits.device_nodes if devbind else ():
            root.mknod(node.path, node.type, node.major, node.minor,
                       node.file_mode if node.file_mode is not None else 0o666, node.uid, node.gid)
        for mount in writable_last(edits.mounts):  # never a path for later targets
            _bind(root, mount)
        _mask_procfs(root, driver, visible)
    ctx = HookContext(rootfs=rootfs, bundle=bundle, spec=spec)
    for hook in edits.hooks:
        args = list(hook.args)
        if args[:3] == ["nvct", "hook", "chain"]:
            chain = args[3:] if compat else _without(args[3:], "enable-cuda-compat")
            steps.run_chain(chain, ctx)


def _without(chain: list[str], name: str) -> list[str]:
    """A hook chain less the steps called ``name`` (cuda-compat-mode = "disabled")."""
    from nvct.injection import join_steps
    from nvct.hooks.steps import _split

    return join_steps([step for step in _split(chain) if step[0] != name])


def _bind(root, mount: Mount) -> None:
    opts = set(mount.options)
    root.bind_mount(mount.host_path, mount.container_path, readonly="ro" in opts,
                    nosuid="nosuid" in opts, nodev="nodev" in opts, noexec="noexec" in opts)


def _mask_procfs(root, driver: Driver, visible) -> None:
    """Show only the visible GPUs under the container's /proc/driver/nvidia/gpus.

    A container whose /proc has no driver/nvidia (a simulated node, or a host
    without the module) is left as it is.
    """
    gpus_dir = "/proc/driver/nvidia/gpus"
    if not root.exists(gpus_dir):
        return
    from nvct import rootfs as rootfs_mod

    host_gpus = os.path.join(driver.proc_root, "driver/nvidia/gpus")
    root.mount_tmpfs(gpus_dir, "mode=0555")
    for gpu in visible:
        source = os.path.join(host_gpus, gpu.bus_id)
        if os.path.isdir(source):
            root.bind_mount(source, f"{gpus_dir}/{gpu.bus_id}", readonly=True, nosuid=True,
                            nodev=True, noexec=True, is_dir=True)
    # Then the tmpfs itself goes read-only: the container cannot add GPUs back.
    fd = root.open(gpus_dir)
    try:
        rootfs_mod.mount(None, f"/proc/self/fd/{fd}", None,
                         rootfs_mod.MS_REMOUNT | rootfs_mod.MS_RDONLY | rootfs_mod.MS_NOSUID
                         | rootfs_mod.MS_NODEV | rootfs_mod.MS_NOEXEC, None)
    finally:
        os.close(fd)
