"""Request + driver -> edits: everything a GPU container gets, and why.

Two halves, so that a CDI spec can carry them apart: ``device_edits`` for
one GPU or MIG device (its nodes), and ``common_edits`` for what every GPU
container of given capabilities shares (control nodes, libraries, binaries,
sockets, firmware, and the in-container hook). ``container_edits`` joins them
for one request. Container paths are the host paths under the driver root,
as the reference chooses them.
"""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError, RequestError
from nvct.base.log import logger
from nvct.config.keys import Settings
from nvct.discover.driver import VDPAU_DIRS, Driver, Gpu, Library, MigDevice, Node, library_sets
from nvct.edits import steps as chain
from nvct.edits.devices import Selection, select
from nvct.edits.model import Chain, ContainerEdits, DeviceNode, Hook, Mount
from nvct.edits.steps import (
    chain_prefix,
    chain_steps as chain_steps,  # the argv test, for callers of this module
)
from nvct.oci.runtime import which
from nvct.request.container import Request

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

RO_MOUNT = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT = ("ro", "nosuid", "nodev", "noexec", "rbind", "rprivate")
RW_MOUNT = ("nosuid", "nodev", "noexec", "rbind", "rprivate")

#: Links the reference creates beside the SONAME links.
_GLX_INDIRECT = ("libGLX_nvidia.so.0", "libGLX_indirect.so.0")
_GLXSERVER = "libglxserver_nvidia.so"
#: gbm loads the driver's backend by this name, a link to the allocator (as the driver installs it).
_GBM_BACKEND = ("libnvidia-allocator.so.1", "gbm/nvidia-drm_gbm.so")


def _library_links(lib: Library, name: str) -> list[tuple[str, str]]:
    """(target, link name in the library's folder) for one injected library file ``name``.

    The SONAME link (when the SONAME is not the file), and for 64-bit libraries the
    unversioned ``.so`` a program links or dlopens by (``libnvidia-ml.so``; the reference
    makes one for every driver library with a short SONAME) and the GLX indirect name.
    """
    links = []
    if lib.soname != name:
        links.append((name, lib.soname))
    if lib.compat32:
        return links
    stem = lib.soname.split(".so", 1)[0] + ".so"
    if os.path.dirname(lib.path) in VDPAU_DIRS:  # a VDPAU module, opened by its SONAME only
        return links
    if stem != lib.soname and (lib.soname != name or stem == "libnvidia-vulkan-producer.so"):
        links.append((lib.soname, stem))
    if lib.soname == _GLX_INDIRECT[0]:
        links.append((lib.soname, _GLX_INDIRECT[1]))
    return links

#: Extra device classes switched on by NVIDIA_GDS and friends: (device globs, files to mount).
GATED = {
    "gds": (("/dev/nvidia-fs*",), ("/etc/cufile.json", "/run/udev")),
    "mofed": (("/dev/infiniband/uverbs*", "/dev/infiniband/rdma_cm"), ()),
    "nvswitch": (("/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch*"), ()),
    "gdrcopy": (("/dev/gdrdrv",), ()),
}


def container_edits(request: Request, driver: Driver, config, *, hook_path: str | None = None,
                    generation=None, sandbox: bool = False, nodes_only: bool = False) -> ContainerEdits:
    """All edits for one GPU request (devices, then what they share).

    ``generation``: jit-cdi's feature flags and hook choices (:mod:`nvct.cdi.features`).
    ``sandbox``: no hook at all (:mod:`nvct.edits.sandbox`).
    ``nodes_only``: the device nodes all the same, the driver's files left undiscovered (legacy's
    device rules: the hook finds the files itself).
    """
    if not request.is_gpu:
        return ContainerEdits()
    from nvct.edits import wsl

    if wsl.is_wsl(driver):  # no NVIDIA module: /dev/dxg and the driver store (nvct.edits.wsl)
        if sandbox:
            raise NvctError("sandbox edits are not available on WSL2 (its driver store needs the ld cache hook)")
        edits = wsl.container_edits(request, driver, hook_path=hook_path or hook_executable(config),
                                    ldconfig=ldconfig_setting(config))
        return generation.finish(edits) if generation is not None else edits
    from nvct.edits import csvmode

    if csvmode.is_tegra(driver):  # a Jetson: what its CSV lists name, in every mode (nvct.edits.csvmode)
        edits = csvmode.container_edits(driver, csvmode.files_for(request, config),
                                        hook_path=hook_path or hook_executable(config),
                                        ldconfig=ldconfig_setting(config))
        return generation.finish(edits) if generation is not None else edits
    selection = selection_for(request, driver, config)
    edits = ContainerEdits()
    device_hooks: list[Hook | Chain] = []  # the DRM nodes' by-path links: after nvct's chain (drm_links_hook)
    graphics = "graphics" in request.capabilities or "display" in request.capabilities
    links_hook = (hook_path or hook_executable(config)) if graphics and not (sandbox or nodes_only) else None
    for gpu in selection.gpus:
        device = gpu_edits(driver, gpu, request.capabilities, hook_path=links_hook)
        device_hooks, device.hooks = device_hooks + device.hooks, []
        edits.extend(device)
    for gpu, mig in selection.migs:
        device = mig_edits(driver, gpu, mig, request.capabilities, hook_path=links_hook)
        device_hooks, device.hooks = device_hooks + device.hooks, []
        edits.extend(device)
    edits.extend(_mig_management_edits(request, driver))
    edits.extend(_imex_edits(request, driver))
    for feature in sorted(request.features):
        edits.extend(gated_edits(driver, feature))
    edits.extend(common_edits(driver, request.capabilities, hook_path=hook_path or hook_executable(config),
                              ldconfig=ldconfig_setting(config), generation=generation, sandbox=sandbox,
                              nodes_only=nodes_only))
    edits.extend(ContainerEdits(hooks=merged_links_hooks(device_hooks)))
    _compat_gpus(edits, driver, selection)
    if not sandbox and generation is not None and generation.hook_enabled(MEMORY_LIMITS_HOOK):
        edits.extend(memory_limit_edits(request, driver, selection.gpus, hook_path or hook_executable(config)))
    if generation is not None:
        generation.finish(edits)
    logger.debug("edits for %r: %d device node(s), %d mount(s), %d hook(s)", request,
                 len(edits.device_nodes), len(edits.mounts), len(edits.hooks))
    return edits


def _compat_gpus(edits: ContainerEdits, driver: Driver, selection: Selection) -> None:
    """The container's GPUs (a MIG device by its parent) on its enable-cuda-compat step: the hook
    asks NVML for their brands only when the image's compat note has a device list (nvct.hooks.compat)."""
    uuids = tuple(dict.fromkeys([gpu.uuid for gpu in selection.gpus] + [gpu.uuid for gpu, _ in selection.migs]))
    for i, hook in enumerate(edits.hooks):
        if uuids and isinstance(hook, Chain) and any(isinstance(s, chain.EnableCudaCompat) for s in hook.steps):
            edits.hooks[i] = hook.replace(steps=tuple(
                s.replace(gpu_uuids=uuids) if isinstance(s, chain.EnableCudaCompat) else s for s in hook.steps))


#: The reference's createRuntime hook that sets a container's GPU memory limits through NVML.
MEMORY_LIMITS_HOOK = "apply-cuda-memory-limits"
#: The variables it reads (MiB): a request and a limit, each under the reference's two names.
MEMORY_VARIABLES = (chain.MEMORY_REQUEST, chain.MEMORY_LIMIT)


def memory_limit_edits(request: Request, driver: Driver, gpus, hook_path: str) -> ContainerEdits:
    """jit-cdi: the apply-cuda-memory-limits hook for the whole GPUs, when the container sets both variables.

    One hook for all of them (the reference's specs have one per GPU, run on every
    start); without the variables there is nothing for it to do, so no hook.
    """
    if not gpus or not all(any(n in request.env for n in names) for names in MEMORY_VARIABLES):
        return ContainerEdits()
    return ContainerEdits(hooks=[memory_limit_hook(driver, gpus, hook_path)])


def memory_limit_hook(driver: Driver, gpus, hook_path: str) -> Hook:
    """The createRuntime hook ``apply-cuda-memory-limits --driver-root R --gpu-id UUID...`` for ``gpus``
    (jit-cdi: the container's whole GPUs; a generated spec: one per GPU device, as the reference's)."""
    step = chain.ApplyCudaMemoryLimits(driver.driver_root, tuple(gpu.uuid for gpu in gpus))
    argv = [*chain_prefix(hook_path)[:-1], *chain.to_argv([step])]
    return Hook("createRuntime", hook_path, tuple(argv),
                reason="NVIDIA_GPU_MEMORY_REQUEST/LIMIT: GPU memory limits by NVML")


def selection_for(request: Request, driver: Driver, config) -> Selection:
    """The GPUs and MIG devices ``request`` names (``nvidia.com/gpu=<id>`` names included)."""
    default_kind = config.cdi_default_kind or "nvidia.com/gpu"
    what = "--device" if request.source == "nvidia-container-cli" else "NVIDIA_VISIBLE_DEVICES"
    return select(request.devices or (), driver, default_kind=default_kind, what=what)


def gpu_edits(driver: Driver, gpu: Gpu, capabilities=(), *, hook_path: str | None = None) -> ContainerEdits:
    """One whole GPU: its device node, and for graphics/display its DRM nodes and, given
    ``hook_path``, the chain that makes their ``/dev/dri/by-path`` links (the reference's)."""
    edits = ContainerEdits(device_nodes=[_device(driver.gpu_node(gpu), f"GPU {gpu.index} ({gpu.uuid})")])
    if "graphics" in capabilities or "display" in capabilities:
        drm = driver.drm_nodes(gpu)
        edits.device_nodes.extend(_device(n, f"DRM node of GPU {gpu.index}") for n in drm)
        if drm and hook_path and (links := driver.drm_links(gpu)):
            edits.hooks.append(drm_links_hook(links, hook_path, f"GPU {gpu.index}"))
    return edits


def mig_edits(driver: Driver, gpu: Gpu, mig: MigDevice, capabilities=(), *,
              hook_path: str | None = None) -> ContainerEdits:
    """A MIG device: the parent GPU's node plus its GPU- and compute-instance access nodes.

    A GPU instance of a graphics profile (``1g.24gb+gfx``) also gets the parent's DRM
    nodes, for graphics or display as a whole GPU does, and, given ``hook_path``, a
    chain that makes their ``/dev/dri/by-path`` links (the reference's, for such a
    MIG device). NVML is asked only when the parent has DRM nodes.
    """
    why = f"MIG device {mig.name} (GPU {gpu.index}, GI {mig.gi}, CI {mig.ci})"
    edits = ContainerEdits(device_nodes=[
        _device(driver.gpu_node(gpu), f"parent GPU of {why}"),
        _device(driver.cap_node(mig.gi_cap_minor), f"GPU-instance access of {why}"),
        _device(driver.cap_node(mig.ci_cap_minor), f"compute-instance access of {why}"),
    ])
    if "graphics" not in capabilities and "display" not in capabilities:
        return edits
    drm = driver.drm_nodes(gpu)
    if drm and (gpu.index, mig.gi) in driver.mig_gfx:
        edits.device_nodes.extend(_device(n, f"DRM node of the parent GPU of {why}, a graphics profile")
                                  for n in drm)
        if hook_path and (links := driver.drm_links(gpu)):
            edits.hooks.append(drm_links_hook(links, hook_path, f"GPU {gpu.index}"))
    return edits


def drm_links_hook(links, hook_path: str, gpus: str) -> Chain:
    """The chain that makes by-path links to DRM nodes in the container (``gpus``: whose, for the reason).

    A hook of its own: /dev is the runtime's tmpfs, so the shim cannot write them
    beforehand (nvct.modifier.prepare); it runs after nvct's main chain.
    """
    return Chain("createContainer", hook_path, tuple(chain_prefix(hook_path)),
                 (chain.CreateSymlinks(tuple(links)),), reason=f"/dev/dri/by-path links of {gpus}")


def merged_links_hooks(hooks: Sequence[Hook | Chain]) -> list[Hook | Chain]:
    """Devices' :func:`drm_links_hook` chains as one, so that a container of many GPUs pays one hook."""
    distinct: list[Hook | Chain] = []
    for hook in hooks:
        if hook not in distinct:  # two MIG devices of one GPU
            distinct.append(hook)
    chains = [c for c in distinct if isinstance(c, Chain)]
    if len(distinct) < 2 or len(chains) != len(distinct):
        return distinct
    links = tuple(dict.fromkeys(link for c in chains for step in c.steps
                                if isinstance(step, chain.CreateSymlinks) for link in step.links))
    return [drm_links_hook(links, chains[0].path, "the container's GPUs")]


def ldconfig_setting(config) -> str | None:
    """``nvidia-container-cli.ldconfig`` when it is not the default (``@/sbin/ldconfig``).

    The update-ldcache step runs that host ldconfig ('@' marks a host path,
    as in the reference), e.g. Ubuntu's ``@/sbin/ldconfig.real``.
    """
    value = config.cli_ldconfig
    if not value:
        return None
    if not isinstance(value, str):
        raise NvctError(f"nvidia-container-cli.ldconfig: must be a string, not {type(value).__name__}")
    return None if value == "@/sbin/ldconfig" else value


def common_edits(driver: Driver, capabilities, *, hook_path: str, ldconfig: str | None = None,
                 generation=None, sandbox: bool = False, nodes_only: bool = False) -> ContainerEdits:
    """What every GPU container with ``capabilities`` gets, whichever GPUs it has.

    ``ldconfig``: the host ldconfig for the update-ldcache step (None: the default).
    ``generation``: feature flags that leave out the IPC sockets or add libraries.
    ``sandbox``: library mounts under their link names instead of the hook (:mod:`nvct.edits.sandbox`).
    ``nodes_only``: the control nodes alone.
    """
    caps = set(capabilities)
    sets = library_sets(caps)  # video brings the compute libraries, display the graphics ones
    edits = ContainerEdits()
    edits.device_nodes.extend(_device(n, "driver control node") for n in driver.control_nodes())
    if nodes_only:
        return edits

    libraries = driver.libraries(sets, compat32="compat32" in caps)
    if "video" in sets:
        libraries += driver.vdpau_libraries()
    if generation is not None:
        libraries += [lib for lib in generation.explicit_libraries(driver) if lib not in libraries]
    for lib in libraries:
        edits.mounts.append(Mount(driver.host_path(lib.path), lib.path, "bind", RO_MOUNT,
                                  reason=f"{lib.capability} library ({lib.arch})"))
    for path in driver.binaries(sorted(caps)):
        edits.mounts.append(Mount(driver.host_path(path), path, "bind", RO_MOUNT, reason="driver utility"))
    for path in driver.ipc(sorted(caps)) if generation is None or generation.ipc else ():
        options = RW_MOUNT if path == "/tmp/nvidia-mps" else IPC_MOUNT
        edits.mounts.append(Mount(driver.host_path(path), path, "bind", options, reason="driver IPC"))
    for path in driver.firmware():
        edits.mounts.append(Mount(driver.host_path(path), path, "bind", RO_MOUNT, reason="GSP firmware"))
    for path, target in driver.config_files(sets):
        edits.mounts.append(Mount(driver.host_path(path), target, "bind", RO_MOUNT, reason="driver config (ICD)"))
    xorg = driver.xorg_files() if "graphics" in sets else []
    for path in xorg:
        edits.mounts.append(Mount(driver.host_path(path), path, "bind", RO_MOUNT, reason="X server module"))

    if sandbox:
        from nvct.edits import sandbox as sandbox_mod

        edits.mounts.extend(sandbox_mod.library_mounts(driver, libraries, sets, xorg))
        return sandbox_mod.hookless(edits)
    steps = in_container_steps(driver, libraries, sets, ldconfig=ldconfig, xorg=xorg)
    if steps:
        edits.hooks.append(Chain("createContainer", hook_path, tuple(chain_prefix(hook_path)), tuple(steps),
                                 reason="symlinks and ld cache inside the container"))
    return edits


def in_container_steps(driver: Driver, libraries, sets, *, ldconfig: str | None = None,
                       xorg: Sequence[str] = ()) -> list[chain.Step]:
    """The hook chain, one process: create-symlinks, enable-cuda-compat, update-ldcache,
    disable-device-node-modification (``sets``: the library sets, :func:`nvct.discover.driver.library_sets`)."""
    links: list[tuple[str, str]] = []
    folders: list[str] = []
    entries: list[str] = []  # what ldconfig enters from the folders: SONAMEs and .so links
    for lib in libraries:
        folder, name = os.path.split(lib.path)
        if folder not in folders:
            folders.append(folder)
        pairs = _library_links(lib, name)
        links.extend((target, f"{folder}/{link}") for target, link in pairs)
        entries.extend(f"{folder}/{n}" for n in [lib.soname, *(link for _, link in pairs if link.endswith(".so"))]
                       if f"{folder}/{n}" not in entries)
        if lib.soname == _GBM_BACKEND[0] and not lib.compat32 and "graphics" in sets:
            links.append((f"../{lib.soname}", f"{folder}/{_GBM_BACKEND[1]}"))
    for path in xorg:  # the X server loads the GLX module by its unversioned name
        folder, name = os.path.split(path)
        if name.startswith(_GLXSERVER + "."):
            links.append((name, f"{folder}/{_GLXSERVER}"))
    steps: list[chain.Step] = []
    if links:
        steps.append(chain.CreateSymlinks(tuple(links)))
    if "compute" in sets:
        # Where NVML is, for the note's device list (a spec's chain finds its GPUs by their nodes).
        steps.append(chain.EnableCudaCompat(driver.version, driver_root="" if driver.driver_root == "/"
                                            else driver.driver_root))
    if folders:
        steps.append(chain.UpdateLdcache(tuple(folders), tuple(entries), ldconfig or ""))
    # Keeps libcuda from creating device nodes in the container (a no-op without /proc/driver/nvidia).
    steps.append(chain.MaskParams())
    return steps


def gated_edits(driver: Driver, feature: str) -> ContainerEdits:
    globs, files = GATED[feature]
    why = f"NVIDIA_{feature.upper()}=enabled"
    edits = ContainerEdits(device_nodes=[_device(n, why) for n in driver.glob_nodes(*globs)])
    for path in files:
        if os.path.exists(driver.host_path(path)):
            edits.mounts.append(Mount(driver.host_path(path), path, "bind", RO_MOUNT, reason=why))
    return edits


def _mig_management_edits(request: Request, driver: Driver) -> ContainerEdits:
    edits = ContainerEdits()
    for ids, minor, what in ((request.mig_config, 1, "NVIDIA_MIG_CONFIG_DEVICES"),
                             (request.mig_monitor, 2, "NVIDIA_MIG_MONITOR_DEVICES")):
        if not ids:
            continue
        selection = select(ids, driver, what=what)
        for gpu in selection.all_parents():
            edits.device_nodes.append(_device(driver.gpu_node(gpu), f"{what}: GPU {gpu.index}"))
        mode = 0o400 if minor == 1 else 0o444
        node = driver.cap_node(minor)
        edits.device_nodes.append(DeviceNode(node.path, node.major, node.minor, host_path=node.host_path,
                                             file_mode=node.file_mode or mode, reason=what))
    return edits


def _imex_edits(request: Request, driver: Driver) -> ContainerEdits:
    edits = ContainerEdits()
    for channel in request.imex_channels:
        node = driver.imex_channel_node(int(channel))
        if not os.path.exists(node.host_path):
            raise RequestError(f"NVIDIA_IMEX_CHANNELS: IMEX channel {channel} does not exist ({node.host_path})")
        edits.device_nodes.append(_device(node, f"IMEX channel {channel}"))
    return edits


def _device(node: Node, reason: str) -> DeviceNode:
    return DeviceNode(node.path, node.major, node.minor, host_path=node.host_path,
                      file_mode=node.file_mode, reason=reason)


#: ``nvidia-ctk.path``'s built-in value: a bare name, which nvct's own lookup serves better.
_CTK_DEFAULT = Settings.ctk_path.default


def hook_executable(config) -> str:
    """The absolute path of the program that in-container hooks run (see :func:`hook_source`)."""
    return hook_source(config)[0]


def hook_source(config) -> tuple[str, str]:
    """The hook program and what chose it (a config key, or how it was found).

    Precedence: ``nvct.path``; else the reference's ``nvidia-ctk.path`` when it
    is set to anything but its built-in bare ``nvidia-ctk``; else the ``nvct``
    beside the running program (its package's bin dir), beside the interpreter,
    then on PATH. A configured bare name is looked up on PATH.
    """
    for row, configured in ((Settings.nvct_path, config.nvct_path), (Settings.ctk_path, config.ctk_path)):
        key = row.name
        if not configured or (row is Settings.ctk_path and configured == _CTK_DEFAULT):
            continue
        if os.path.isabs(configured):
            return configured, key
        found = which(configured)
        if not found:
            raise NvctError(f"{key}: {configured!r} not found on PATH")
        return os.path.abspath(found), key
    here = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0] or "")), "nvct")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here, "the nvct beside the running program"
    beside_python = os.path.join(os.path.dirname(sys.executable), "nvct")
    if os.path.isfile(beside_python):
        return beside_python, "the nvct beside the interpreter"
    found = which("nvct")
    if found:
        return os.path.abspath(found), "PATH"
    raise NvctError("cannot find the nvct executable for in-container hooks; set nvct.path in the config")
