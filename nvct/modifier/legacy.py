"""Realize edits inside a running container's mount namespace (legacy mode).

The prestart hook runs on the host while the container waits before
pivot_root. It grants device access in the container's cgroup from the host,
then, in a child that joined the container's mount namespace, creates the
device nodes, bind-mounts the driver files, masks /proc/driver/nvidia, and
runs the same in-container steps a jit-cdi spec's hook would.
"""

from __future__ import annotations

import os

from nvct.discover.driver import Driver
from nvct.edits import build as injection
from nvct.edits.model import ContainerEdits, Mount, writable_last
from nvct.hooks.container import HookContext
from nvct.request.container import Request

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
    from nvct.linux import cgroups, namespaces, privileges
    from nvct.modifier import modes
    from nvct.oci import spec as ocispec
    from nvct.rootfs import mounttargets

    if config.cli_load_kmods:
        from nvct.node import kmods

        kmods.load(config.proc_root, config.dev_root)
    driver = Driver.from_config(config)
    edits = injection.container_edits(request, driver, config)
    modes.check_requirements(request, driver, config)
    privileges.drop_capabilities(KEEP_CAPS)
    rootfs = ocispec.root_path(rootfs, None) if rootfs else ocispec.rootfs(spec, bundle or ".")
    mounttargets.check_proc(spec, rootfs)  # no volume under the /proc we mask
    if not config.cli_no_cgroups:
        cgroups.allow_devices(pid, [(d.type, d.major, d.minor, "rwm") for d in edits.device_nodes])
    from nvct.edits import csvmode, wsl

    # WSL2 and Jetson have no /proc/driver/nvidia, and a GPU index names nothing there.
    procfs = ([], []) if wsl.is_wsl(driver) or csvmode.is_tegra(driver) else procfs_view(
        request, driver, injection.selection_for(request, driver, config))
    compat = config.legacy_cuda_compat_mode != "disabled"
    from nvct.rootfs.root import root_identity

    # Verified here, in the host's mount namespace: in the container's, the runtime may have
    # mounted another directory over root.path (it lost a race against the path's owner).
    identity = root_identity(rootfs, ocispec.root_owners(spec or {}))
    namespaces.in_mount_namespace_of(pid, _inside, edits, rootfs, driver, procfs, spec, bundle, devbind, compat,
                                     identity)
    return edits


def _inside(edits: ContainerEdits, rootfs: str, driver: Driver, procfs, spec, bundle, devbind=True,
            compat=True, identity: tuple[int, int] | None = None) -> None:
    from nvct.edits import steps as kinds
    from nvct.edits.model import as_chain
    from nvct.hooks import steps
    from nvct.oci import spec as ocispec
    from nvct.rootfs.root import Rootfs

    root = Rootfs(rootfs, owners=ocispec.root_owners(spec or {}), same_as=identity)
    with root:  # once, for every write
        for node in edits.device_nodes if devbind else ():
            root.mknod(node.path, node.type, node.major, node.minor,
                       node.file_mode if node.file_mode is not None else 0o666, node.uid, node.gid)
        for mount in writable_last(edits.mounts):  # never a path for later targets
            _bind(root, mount)
        _mask_procfs(root, driver, procfs)
        ctx = HookContext(rootfs=rootfs, bundle=bundle, spec=spec, root=root)
        # params are masked by _mask_procfs's tmpfs already; cuda-compat-mode = "disabled" drops compat
        drop = (kinds.MaskParams,) if compat else (kinds.MaskParams, kinds.EnableCudaCompat)
        for hook in edits.hooks:
            chain = as_chain(hook)
            if chain is not None:
                steps.run([s for s in chain.steps if not isinstance(s, drop)], ctx)


def _bind(root, mount: Mount) -> None:
    from nvct.hooks.mounts import mount_flags

    root.bind_mount(mount.host_path, mount.container_path,
                    **mount_flags(mount.options, f"mount of {mount.container_path}"))


#: The driver's own files that libnvidia-container copies into the container's /proc/driver/nvidia.
_PROC_FILES = ("params", "version", "registry")
_PROC_DRIVER = "/proc/driver/nvidia"


def procfs_view(request: Request, driver: Driver, selection) -> tuple[list, list[str]]:
    """What of /proc/driver/nvidia the container sees, as libnvidia-container decides it.

    The selected GPUs (MIG devices' parents included) under ``gpus/``; under
    ``capabilities/``, the access files of the selected MIG devices, or with
    NVIDIA_MIG_CONFIG_DEVICES/NVIDIA_MIG_MONITOR_DEVICES the whole directory
    (config and monitor caps, every GPU's MIG tree), as the reference mounts it.
    Returns (GPUs, capability paths relative to ``capabilities/``).
    """
    if request.mig_config or request.mig_monitor:
        return selection.all_parents(), [""]
    caps = []
    for gpu, mig in selection.migs:
        gi = f"gpu{gpu.minor}/mig/gi{mig.gi}"
        caps += [f"{gi}/access", f"{gi}/ci{mig.ci}/access"]
    return selection.all_parents(), caps


def procfs_paths(procfs) -> list[str]:
    """What :func:`_mask_procfs` shows, relative to /proc/driver/nvidia (for ``nvct explain``)."""
    gpus, caps = procfs
    return [*_PROC_FILES, *(f"gpus/{g.bus_id}" for g in gpus), *(f"capabilities/{c}".rstrip("/") for c in caps)]


def _mask_procfs(root, driver: Driver, procfs) -> None:
    """/proc/driver/nvidia as libnvidia-container leaves it: only what the container asked for.

    A read-only tmpfs over it holds copies of params (with ``ModifyDeviceFiles: 0``),
    version and registry, the selected GPUs' ``gpus/<bus>`` and the MIG capability
    files (see :func:`procfs_view`), each bound read-only from the proc root. Other
    GPUs and their MIG capabilities, and ``capabilities/mig/{config,monitor}`` unless
    asked for, are not there at all. A container whose /proc has no driver/nvidia
    (a host without the module) is left as it is; one that is not the kernel's is refused
    (nvct.hooks.procmask.kernel_proc_path).
    """
    from nvct.hooks.procmask import kernel_proc_path

    if not kernel_proc_path(root, _PROC_DRIVER):
        return
    from nvct.linux import fs

    gpus, caps = procfs
    host = os.path.join(driver.proc_root, "driver/nvidia")
    files = {}
    for name in _PROC_FILES:
        try:
            with open(os.path.join(host, name), "rb") as f:
                data = f.read(1 << 20)
            mode = os.stat(os.path.join(host, name)).st_mode & 0o444
        except FileNotFoundError:
            continue  # as the reference: a file this module lacks is skipped
        if name == "params":
            data = data.replace(b"ModifyDeviceFiles: 1", b"ModifyDeviceFiles: 0")  # libcuda makes no nodes
        files[name] = (data, mode)
    root.mount_tmpfs(_PROC_DRIVER, "mode=0555")
    for name, (data, mode) in files.items():
        root.write_file(f"{_PROC_DRIVER}/{name}", data, mode)
    flags = {"readonly": True, "nosuid": True, "nodev": True, "noexec": True}
    for gpu in gpus:
        source = os.path.join(host, "gpus", gpu.bus_id)
        if os.path.isdir(source):
            root.bind_mount(source, f"{_PROC_DRIVER}/gpus/{gpu.bus_id}", is_dir=True, **flags)
    for rel in caps:
        source = os.path.join(host, "capabilities", rel)
        if os.path.exists(source):
            root.bind_mount(source, f"{_PROC_DRIVER}/capabilities/{rel}".rstrip("/"), **flags)
    # Then the tmpfs itself goes read-only: the container cannot add anything back.
    fd = root.open(_PROC_DRIVER)
    try:
        fs.mount(None, f"/proc/self/fd/{fd}", None,
                 fs.MS_REMOUNT | fs.MS_RDONLY | fs.MS_NOSUID | fs.MS_NODEV | fs.MS_NOEXEC, None)
    finally:
        os.close(fd)
