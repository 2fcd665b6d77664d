"""A CDI spec for this node's GPUs, as ``nvidia-ctk cdi generate`` makes one.

Devices: one per GPU and one per MIG device, under every name the naming
strategies give (``index``: ``0``, ``0:1``; ``uuid``: the GPU or MIG UUID;
``type-index``: ``gpu0``, ``mig0:1``), and ``all`` merging them. Unlike the
reference generator, a GPU with MIG enabled gets a device too: the
reference's legacy mode gives such a GPU whole, and nvct's modes agree with
each other. What every GPU container needs (control nodes, libraries,
binaries, IPC sockets, firmware, the createContainer hook) is the spec's own
``containerEdits``, with ``NVIDIA_VISIBLE_DEVICES=void`` so that no hook
injects the GPUs a second time.

Host paths lie under the driver and device roots, container paths are as on
a host (:mod:`nvct.edits.build` computes both). The ``management`` mode gives
one ``all`` device with every NVIDIA device node, for monitoring containers,
and a device per GPU and MIG device under the strategies' names, each with
the control nodes and that device's nodes (device plugins ask for one by UUID).
``sandbox`` gives the GPUs with no hook at all (:mod:`nvct.edits.sandbox`).
The modes ``gds``, ``mofed``, ``gdrcopy`` and ``nvswitch`` give one ``all``
device with that subsystem's device nodes (and, for GDS, ``/etc/cufile.json``
and ``/run/udev``); ``imex`` one device per IMEX channel, named by its number.
Those specs have no edits of their own, as the reference's. ``wsl`` (chosen by
``auto`` on a WSL2 node, :mod:`nvct.edits.wsl`) gives one ``all`` device, ``/dev/dxg``,
and the driver store's files as the spec's own edits; ``csv`` (``auto`` on a Tegra
board, :mod:`nvct.edits.csvmode`) one ``all`` device with the CSV lists' device nodes, and
their files as the spec's own edits.

The result's ``cdiVersion`` is the lowest that can express it, so a plain GPU
spec is readable by runtimes that know only CDI 0.5.0 (podman 4.3).
"""

from __future__ import annotations

import os

from nvct.base.errors import DriverError, NvctError, RequestError
from nvct.cdi import schema, spec as spec_mod
from nvct.cdi.features import Generation
from nvct.config.file import ALL_CAPABILITIES
from nvct.discover.driver import Driver, Gpu, MigDevice, Node
from nvct.edits import build as injection, csvmode, devices, steps as kinds, wsl
from nvct.edits.model import Chain, ContainerEdits, DeviceNode, as_chain
from nvct.request import cdinames as names, requirements

TYPE_CHECKING = False  # typing costs an import
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence

STRATEGIES = ("index", "uuid", "type-index")
DEFAULT_STRATEGIES = ("index", "uuid")
GATED_MODES = ("gds", "mofed", "gdrcopy", "nvswitch")
MODES = ("auto", "nvml", "management", *GATED_MODES, "imex", "wsl", "sandbox", "csv")
#: The reference's other modes, refused with the reason.
UNSUPPORTED_MODES: dict[str, str] = {}
#: IMEX channel ids fit a device minor (20 bits).
MAX_IMEX_CHANNEL = (1 << 20) - 1
DEFAULT_VENDOR = "nvidia.com"
DEFAULT_CLASS = "gpu"
ALL_DEVICE = "all"
NONE_DEVICE = "none"
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"

#: A CDI spec serves any container: every capability's files (no 32-bit libraries, as the reference).
CAPABILITIES = tuple(c for c in ALL_CAPABILITIES if c != "compat32")

#: Device nodes of the management mode, and name prefixes it leaves out (as the reference).
_MANAGEMENT_NODES = (
    "/dev/nvidia*", "/dev/nvidia-caps/nvidia-cap*", "/dev/nvidia-modeset", "/dev/nvidia-uvm-tools",
    "/dev/nvidia-uvm", "/dev/nvidiactl", "/dev/nvidia-caps-imex-channels/channel*",
)
_MANAGEMENT_SKIPPED = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")


def generate(driver: Driver, *, hook_path: str, vendor: str = DEFAULT_VENDOR, cls: str = DEFAULT_CLASS,
             device_ids: Sequence[str] = (ALL_DEVICE,), strategies: Sequence[str] = DEFAULT_STRATEGIES,
             mode: str = "auto", all_device: bool = True, ldconfig: str | None = None,
             generation: Generation | None = None, gids: bool = False,
             requirements: bool = True, csv_files: Sequence[str] = ()) -> dict[str, Any]:
    """The spec (a mapping ready to write) for ``driver``'s devices.

    ``generation``: feature flags and hook choices (default: the reference's defaults).
    ``requirements``: the chain starts with the check-requirements step (:func:`_requirements_step`);
    False where the caller checks (the shim's cdi mode) or the config's ``disable-require`` is set.
    ``gids``: give device nodes' groups as additional GIDs (:meth:`Generation.finish`):
    in-memory specs only, since they need CDI 0.7.0, which podman 4.3 cannot read.
    """
    reason = names.vendor_error(vendor) or names.class_error(cls)
    if reason:
        raise NvctError(f"invalid CDI kind {vendor}/{cls}: {reason}")
    if mode in UNSUPPORTED_MODES:
        raise NvctError(f"CDI generate mode {mode!r} ({UNSUPPORTED_MODES[mode]}) is not supported by nvct")
    if mode not in MODES:
        raise NvctError(f"unknown CDI generate mode {mode!r} (one of {', '.join(MODES)})")
    if generation is None:
        generation = Generation()
    if mode == "auto" and wsl.is_wsl(driver):  # as the reference: a WSL2 node gets the wsl spec
        mode = "wsl"
    if mode == "csv" or (mode == "auto" and csvmode.is_tegra(driver)):  # as the reference on a Tegra board
        files = list(csv_files) or csvmode.csv_files(csvmode.DEFAULT_MOUNT_SPEC_PATH)
        if not files:
            raise DriverError("--mode csv: no CSV files (devices.csv, drivers.csv, l4t.csv in "
                              f"{csvmode.MOUNT_SPEC_PATH_KEY}); name them with --csv.file")
        common = generation.finish(csvmode.container_edits(driver, files, hook_path=hook_path, ldconfig=ldconfig),
                                   gids=gids)
        entries = [(ALL_DEVICE, ContainerEdits(device_nodes=common.device_nodes))]
        common.device_nodes = []
        common.env.append(VOID_ENV)
        return _spec(vendor, cls, entries, common, False, generation, gids)
    if mode == "wsl":
        wsl.check_ids(device_ids, "--device-id")
        entries = [(ALL_DEVICE, ContainerEdits(device_nodes=[wsl.dxg_node(driver)]))]
        common = generation.finish(wsl.common_edits(driver, hook_path=hook_path, ldconfig=ldconfig), gids=gids)
        common.env.append(VOID_ENV)
        return _spec(vendor, cls, entries, common, False, generation, gids)
    if mode == "management":  # libcuda may not create nodes, but the container has every node anyway
        generation = generation.with_disabled("disable-device-node-modification")
    if mode in GATED_MODES or mode == "imex":
        common = ContainerEdits()
        entries = (_gated_entries(driver, mode) if mode in GATED_MODES else _imex_entries(driver, device_ids))
        all_device = all_device and NONE_DEVICE not in device_ids
        return _spec(vendor, cls, entries, common, all_device, generation, gids)
    if mode == "sandbox":  # the GPUs without hooks (nvct.edits.sandbox)
        if wsl.is_wsl(driver):
            raise NvctError("--mode sandbox: not available on WSL2 (its driver store needs the ld cache hook)")
        common = generation.finish(injection.common_edits(driver, CAPABILITIES, hook_path=hook_path,
                                                          generation=generation, sandbox=True), gids=gids)
        if NONE_DEVICE in device_ids:
            entries, all_device = [(NONE_DEVICE, ContainerEdits(env=[VOID_ENV]))], False
        else:
            entries = _device_entries(driver, device_ids, _unique_strategies(strategies))
        common.env.append(VOID_ENV)
        return _spec(vendor, cls, entries, common, all_device, generation, gids)
    common = injection.common_edits(driver, CAPABILITIES, hook_path=hook_path, ldconfig=ldconfig,
                                    generation=generation)
    if requirements and mode != "management" and NONE_DEVICE not in device_ids:
        _requirements_step(common, driver)
    common = _writable_mounts_by_hook(generation.finish(common, gids=gids))
    if mode == "management":
        control, common.device_nodes = common.device_nodes, []
        entries = [(ALL_DEVICE, _management_edits(driver))]
        if NONE_DEVICE not in device_ids:
            entries += _management_entries(driver, device_ids, _unique_strategies(strategies), control)
        all_device = False
    elif NONE_DEVICE in device_ids:
        entries = [(NONE_DEVICE, ContainerEdits(env=[VOID_ENV]))]
        all_device = False
    else:
        limits = hook_path if generation.hook_enabled(injection.MEMORY_LIMITS_HOOK) else None
        entries = _device_entries(driver, device_ids, _unique_strategies(strategies), limits, hook_path)
    common.env.append(VOID_ENV)
    return _spec(vendor, cls, entries, common, all_device, generation, gids)


def _spec(vendor: str, cls: str, entries: list[tuple[str, ContainerEdits]], common: ContainerEdits,
          all_device: bool, generation: Generation, gids: bool) -> dict[str, Any]:
    done: dict[int, ContainerEdits] = {}
    for _, edits in entries:  # one edits object may serve several names
        if id(edits) not in done:
            done[id(edits)] = generation.finish(edits, gids=gids)
    if all_device and entries and not any(name == ALL_DEVICE for name, _ in entries):
        merged = ContainerEdits()
        for _, edits in entries:
            merged.extend(edits)
        links = [h for h in merged.hooks if isinstance(h, Chain)]  # the devices' by-path links: one hook
        merged.hooks = [*(h for h in merged.hooks if not isinstance(h, Chain)), *injection.merged_links_hooks(links)]
        entries.append((ALL_DEVICE, merged))
    raw: dict[str, Any] = {
        "cdiVersion": "",
        "kind": f"{vendor}/{cls}",
        "devices": [{"name": name, "containerEdits": _sorted(_without(edits, common)).to_cdi()}
                    for name, edits in sorted(entries, key=lambda e: e[0])],
        "containerEdits": _sorted(common).to_cdi(),
    }
    try:
        raw["cdiVersion"] = schema.minimum_version(raw)
        spec_mod.validate(raw)
    except schema.Invalid as e:  # pragma: no cover - a bug in the generator
        raise NvctError(f"generated CDI spec is invalid: {e}") from None
    return raw


def device_names(gpu: Gpu, strategies: Sequence[str]) -> list[str]:
    by = {"index": str(gpu.index), "uuid": gpu.uuid, "type-index": f"gpu{gpu.index}"}
    return [by[s] for s in strategies]


def mig_device_names(gpu: Gpu, mig: MigDevice, strategies: Sequence[str],
                     mig_uuid: Callable[[Gpu, MigDevice], str]) -> list[str]:
    out = []
    for s in strategies:
        if s == "index":
            out.append(f"{gpu.index}:{mig.index}")
        elif s == "type-index":
            out.append(f"mig{gpu.index}:{mig.index}")
        else:
            out.append(mig_uuid(gpu, mig))
    return out


def _device_entries(driver: Driver, device_ids: Sequence[str], strategies: Sequence[str],
                    memory_limits: str | None = None,
                    hook_path: str | None = None) -> list[tuple[str, ContainerEdits]]:
    """Each GPU's and MIG device's edits under each of its names.

    ``memory_limits``: the hook program for each whole GPU's ``apply-cuda-memory-limits``
    createRuntime hook (the reference's; it does nothing without the container's
    ``NVIDIA_GPU_MEMORY_REQUEST``/``LIMIT``); MIG devices get none (NVML refuses them).
    ``hook_path``: the hook program for the by-path links of a GPU's DRM nodes, and of a graphics
    MIG device's parent's (none without).
    """
    selection = devices.select(tuple(device_ids), driver, what="--device-id")
    entries: list[tuple[str, ContainerEdits]] = []
    for gpu in selection.gpus:
        edits = injection.gpu_edits(driver, gpu, CAPABILITIES, hook_path=hook_path)
        if memory_limits:
            edits.hooks.append(injection.memory_limit_hook(driver, [gpu], memory_limits))
        entries.extend((name, edits) for name in device_names(gpu, strategies))
    uuids: dict[tuple[int, int], str] = {}

    def mig_uuid(gpu: Gpu, mig: MigDevice) -> str:
        if not uuids:
            uuids.update({where: uuid for uuid, where in driver.mig_uuids.items()})
        try:
            return uuids[(gpu.index, mig.index)]
        except KeyError:
            raise DriverError(f"NVML reports no UUID for MIG device {mig.name} "
                              f"(GPU {gpu.index}, GI {mig.gi}, CI {mig.ci})") from None

    for gpu, mig in selection.migs:
        edits = injection.mig_edits(driver, gpu, mig, CAPABILITIES, hook_path=hook_path)
        entries.extend((name, edits) for name in mig_device_names(gpu, mig, strategies, mig_uuid))
    return entries


def _gated_entries(driver: Driver, mode: str) -> list[tuple[str, ContainerEdits]]:
    """One ``all`` device with the subsystem's nodes (GDS's files only when it has nodes)."""
    edits = injection.gated_edits(driver, mode)
    if not edits.device_nodes:
        globs = ", ".join(injection.GATED[mode][0])
        raise DriverError(f"--mode {mode}: no device nodes {globs} under {driver.dev_host_path('/dev')}")
    return [(ALL_DEVICE, edits)]


def _imex_entries(driver: Driver, device_ids: Sequence[str]) -> list[tuple[str, ContainerEdits]]:
    """A device per IMEX channel: ``all`` (the channels present), ``N`` or ``channelN``."""
    if NONE_DEVICE in device_ids:
        return [(NONE_DEVICE, ContainerEdits(env=[VOID_ENV]))]
    channels: list[int] = []
    for raw in device_ids:
        trimmed = raw[len("channel"):] if raw.startswith("channel") else raw
        if trimmed == ALL_DEVICE:
            found = [n.path for n in driver.glob_nodes("/dev/nvidia-caps-imex-channels/channel*")]
            channels.extend(int(p.rsplit("channel", 1)[1]) for p in found if p.rsplit("channel", 1)[1].isdigit())
            continue
        if not trimmed.isdigit() or int(trimmed) > MAX_IMEX_CHANNEL:
            raise RequestError(f"--device-id {raw!r}: not an IMEX channel (0 to {MAX_IMEX_CHANNEL}, "
                               "channelN, or all)")
        channels.append(int(trimmed))
    entries = []
    for channel in sorted(set(channels)):
        node = driver.imex_channel_node(channel)
        if not os.path.exists(node.host_path):
            raise DriverError(f"IMEX channel {channel} not found at {node.host_path}")
        entries.append((str(channel), ContainerEdits(device_nodes=[
            DeviceNode(node.path, node.major, node.minor, host_path=node.host_path, file_mode=node.file_mode,
                       reason=f"IMEX channel {channel}")])))
    if not entries:
        where = driver.dev_host_path("/dev/nvidia-caps-imex-channels")
        raise DriverError(f"--mode imex: no IMEX channels under {where}")
    return entries


def _management_entries(driver: Driver, device_ids: Sequence[str], strategies: Sequence[str],
                        control: list[DeviceNode]) -> list[tuple[str, ContainerEdits]]:
    """Per-GPU and per-MIG devices beside ``all``, for device plugins that name one
    (``management.nvidia.com/gpu=GPU-<uuid>``): each is what the GPU spec's device of that name
    gives, plus the control nodes, which the management spec's common edits leave to ``all``.
    Never the MIG config/monitor capabilities: those are ``all``'s alone."""
    out = []
    done: dict[int, ContainerEdits] = {}
    for name, edits in _device_entries(driver, device_ids, strategies):
        if id(edits) not in done:
            done[id(edits)] = ContainerEdits(device_nodes=[*control, *edits.device_nodes])
        out.append((name, done[id(edits)]))
    return out


def _management_edits(driver: Driver) -> ContainerEdits:
    nodes: dict[str, Node] = {}
    for node in driver.glob_nodes(*_MANAGEMENT_NODES):
        if not os.path.basename(node.path).startswith(_MANAGEMENT_SKIPPED):
            nodes.setdefault(node.path, node)
    if not nodes:
        raise DriverError(f"no NVIDIA device nodes found under {driver.dev_host_path('/dev')}")
    return ContainerEdits(device_nodes=[
        DeviceNode(n.path, n.major, n.minor, host_path=n.host_path, file_mode=n.file_mode,
                   reason="management: every NVIDIA device node") for n in nodes.values()])


def _unique_strategies(strategies: Iterable[str]) -> list[str]:
    out = []
    for s in strategies:
        if s not in STRATEGIES:
            raise RequestError(f"unknown device name strategy {s!r} (one of {', '.join(STRATEGIES)})")
        if s not in out:
            out.append(s)
    return out or list(DEFAULT_STRATEGIES)


def _without(edits: ContainerEdits, common: ContainerEdits) -> ContainerEdits:
    """A device's edits minus what the spec's own edits already give, unless that leaves none."""
    rest = ContainerEdits(
        env=[e for e in edits.env if e not in common.env],
        device_nodes=[n for n in edits.device_nodes if n not in common.device_nodes],
        mounts=[m for m in edits.mounts if m not in common.mounts],
        hooks=[h for h in edits.hooks if h not in common.hooks],
        additional_gids=[g for g in edits.additional_gids if g not in common.additional_gids],
    )
    return edits if rest.is_empty() else rest


def _requirements_step(edits: ContainerEdits, driver: Driver) -> None:
    """The check-requirements step first in nvct's chain, with this node's facts as its arguments.

    Native CDI consumers (podman, containerd, docker's CDI ``--gpus``) never run
    the shim, so the chain they run anyway enforces ``NVIDIA_REQUIRE_*``: no
    extra process, and no NVML at start (the facts are read now). Beyond the
    reference (toolkit #1470): its specs check nothing.
    """
    found = next(((i, c) for i, h in enumerate(edits.hooks) if (c := as_chain(h)) is not None), None)
    if found is None:
        return
    gpus = list(driver.gpus)
    try:
        facts = requirements.driver_facts(driver, gpus, True, True)
    except NvctError as e:  # the driver version alone still holds the driver conditions
        from nvct.base.log import logger

        logger.warning("check-requirements: %s; cuda, arch and brand conditions will hold", e)
        facts = requirements.driver_facts(driver, [], False, False)
    step = kinds.CheckRequirements(facts.driver or "", facts.cuda or "", tuple(
        (driver.gpu_node(gpu).path, arch or "", brand or "") for gpu, (arch, brand) in zip(gpus, facts.devices)))
    chain, hook = found
    edits.hooks[chain] = hook.replace(steps=(step, *hook.steps))


def _writable_mounts_by_hook(edits: ContainerEdits) -> ContainerEdits:
    """Writable mounts (the MPS pipe dir) become ``bind-mount`` steps at the end of the hook chain.

    Podman, containerd and cri-o apply a spec's mounts sorted by depth, fewer
    path components first, whatever order it has: ``/tmp/nvidia-mps`` would
    come before every library and firmware target, and an image linking one
    of their folders to it would make the runtime create those targets in the
    host's directory. The createContainer hook runs after every mount, and
    mounts through the Rootfs (docs/security.md, "Writable mounts last").
    """
    writable = [m for m in edits.mounts if m.writable]
    if not writable:
        return edits
    found = next(((i, c) for i, h in enumerate(edits.hooks) if (c := as_chain(h)) is not None), None)
    if found is None:  # every hook disabled: a spec mount would be mounted before the others
        from nvct.base.log import logger

        for m in writable:
            logger.warning("%s left out: nvct mounts it by the createContainer hook, and every hook is "
                           "disabled", m.container_path)
        edits.mounts = [m for m in edits.mounts if not m.writable]
        return edits
    chain, hook = found
    mounts = tuple(kinds.BindMount(m.host_path, m.container_path, m.options) for m in writable)
    edits.hooks[chain] = hook.replace(steps=(*hook.steps, *mounts))
    edits.mounts = [m for m in edits.mounts if not m.writable]
    return edits


def _sorted(edits: ContainerEdits) -> ContainerEdits:
    """Nodes and mounts by depth, then path: a parent directory's mount comes first."""
    def depth(path: str) -> tuple[int, str]:
        return os.path.normpath(path).count("/"), path

    return ContainerEdits(
        env=list(edits.env),
        device_nodes=sorted(edits.device_nodes, key=lambda n: depth(n.path)),
        mounts=sorted(edits.mounts, key=lambda m: depth(m.container_path)),
        hooks=list(edits.hooks),
        additional_gids=list(edits.additional_gids),
    )
