"""The GPUs of a simulated node: what NVML, /proc and /dev will show.

A topology is JSON (schema in docs/simulated-node.md): GPU *models* (what a
board is: name, PCI ids, memory, MIG profiles) and *gpus* (where each board
sits: minor, PCI bus id, UUID, MIG instances). :func:`resolve` validates it and
derives everything the node builder needs, deterministically, so the same
input always gives the same UUIDs, cap minors and MIG placements.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import uuid as _uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, NoReturn

from nvct.base.errors import NvctError
from nvct.discover.nvml import BRAND_NAMES

DEFAULT_TOPOLOGY = os.path.join(os.path.dirname(__file__), "dgx-h100.json")

#: Highest device minor the kernel module hands out (254/255 are modeset/ctl).
MAX_GPU_MINOR = 253
#: /proc/driver/nvidia-caps/mig-minors covers GPU minors 0-31 only.
MIG_MAX_GPU_MINOR = 31
MIG_MAX_GI = 14
MIG_MAX_CI = 7

#: Bus numbers of a DGX H100's GPUs; synthetic nodes repeat them per PCI domain.
_SYNTHETIC_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)
_UUID_NAMESPACE = _uuid.uuid5(_uuid.NAMESPACE_URL, "nvct:simulated-gpu")
_BUS_ID = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
#: NVML_GPU_INSTANCE_PROFILE_*_SLICE_GFX: a profile of these constants has graphics unless it says not.
_GFX_PROFILES = (10, 11, 12, 17)
#: CI profile constant (NVML_COMPUTE_INSTANCE_PROFILE_*) of a full CI, by slice count.
_CI_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 6: 5, 7: 4, 8: 7}


class TopologyError(NvctError):
    """A topology file or dict is malformed or impossible."""


@dataclass(frozen=True)
class MigProfile:
    name: str
    profile: int          # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int               # profile id (nvmlGpuInstanceProfileInfo_t.id)
    slices: int
    max: int
    multiprocessors: int
    memory_mib: int
    placement_size: int
    placements: tuple
    gi_ids: tuple
    gfx: bool = False     # NVML_GPU_INSTANCE_PROFILE_CAPS_GFX: graphics (``1g.24gb+gfx``)

    @property
    def ci_profile(self) -> int:
        """The constant of the compute-instance profile that fills the whole GI."""
        return _CI_PROFILE_BY_SLICES[self.slices]


@dataclass(frozen=True)
class MigDevice:
    index: int            # among its parent's MIG devices, (GI, CI) order
    gi: int
    ci: int
    uuid: str
    profile: str
    name: str
    gi_profile: int
    gi_profile_id: int
    ci_profile: int
    placement_start: int
    placement_size: int
    slices: int
    multiprocessors: int
    memory_mib: int
    gi_cap_minor: int
    ci_cap_minor: int
    gfx: bool = False     # its GPU instance's profile has graphics


@dataclass(frozen=True)
class Gpu:
    index: int
    minor: int
    uuid: str
    bus_id: str           # /proc form: 0000:1b:00.0
    domain: int
    bus: int
    device: int
    function: int
    name: str
    pci_device_id: int
    pci_subsystem_id: int
    brand: int
    architecture: int
    cc_major: int
    cc_minor: int
    memory_mib: int
    reserved_mib: int
    multiprocessors: int
    cores: int
    vbios: str
    board_part_number: str
    serial: str
    power_limit_mw: int
    dma_bits: int
    irq: int
    model: str            # key into Topology.models
    mig_capable: bool
    mig_enabled: bool
    max_mig_devices: int
    memory_slices: int
    persistence_mode: bool = True
    mig_devices: tuple = ()

    @property
    def nvml_bus_id(self) -> str:
        """The bus id as NVML prints it: 00000000:1B:00.0."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.{self.function}"


@dataclass(frozen=True)
class Topology:
    name: str
    gpus: tuple
    profiles: Mapping[str, tuple] = field(default_factory=dict)   # model key -> MigProfile...
    imex_channels: int = 2
    nvswitches: int = 0
    sha256: str = ""

    @property
    def mig_devices(self) -> list:
        return [m for g in self.gpus for m in g.mig_devices]


def gi_cap_minor(gpu_minor: int, gi: int) -> int:
    """The nvidia-caps minor of ``gpu<gpu_minor>/gi<gi>/access``."""
    return 3 + 135 * gpu_minor + 9 * gi


def ci_cap_minor(gpu_minor: int, gi: int, ci: int) -> int:
    """The nvidia-caps minor of ``gpu<gpu_minor>/gi<gi>/ci<ci>/access``."""
    return gi_cap_minor(gpu_minor, gi) + 1 + ci


def load(topology: None | str | os.PathLike | Mapping[str, Any]) -> tuple[dict, str]:
    """The raw topology and a name for it in errors: a dict, a JSON file, or the default."""
    if isinstance(topology, Mapping):
        return copy.deepcopy(dict(topology)), "topology"
    path = os.fspath(topology) if topology is not None else DEFAULT_TOPOLOGY
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TopologyError(f"{path}: topology file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{path}: cannot read topology file: {e}") from None
    except json.JSONDecodeError as e:
        raise TopologyError(f"{path}: invalid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: a topology must be a JSON object")
    return data, path


def resolve(raw: Mapping[str, Any], *, gpus: int | None = None, mig: bool = True,
            source: str = "topology") -> Topology:
    """Validate ``raw`` and derive every GPU and MIG device.

    ``gpus`` keeps the first N GPUs, or, when N is larger than the topology,
    makes N GPUs of the first GPU's model at minors 0..N-1 on synthetic buses.
    ``mig=False`` disables MIG everywhere.
    """
    ctx = _Ctx(source)
    models = ctx.mapping(raw.get("models"), "models")
    entries = ctx.list(raw.get("gpus"), "gpus")
    if not entries:
        raise TopologyError(f"{source}: gpus: a topology needs at least one GPU")
    entries = [ctx.mapping(e, f"gpus[{i}]") for i, e in enumerate(entries)]
    if gpus is not None:
        entries = _scale(entries, gpus, source)

    profiles = {}
    parsed = []
    for i, entry in enumerate(entries):
        where = f"gpus[{i}]"
        key = ctx.string(entry.get("model"), f"{where}.model")
        if key not in models:
            raise TopologyError(f"{source}: {where}.model: unknown model {key!r}")
        if key not in profiles:
            profiles[key] = _profiles(ctx, ctx.mapping(models[key], f"models.{key}"), f"models.{key}")
        parsed.append(_gpu_fields(ctx, entry, ctx.mapping(models[key], f"models.{key}"), key, where, mig))

    parsed.sort(key=lambda g: (g["domain"], g["bus"], g["device"], g["function"]))
    _unique(source, parsed, "minor")
    _unique(source, parsed, "bus_id")
    result = []
    for index, fields in enumerate(parsed):
        instances = fields.pop("_instances")
        where = fields.pop("_where")
        mig_devices = _place(ctx, fields, profiles[fields["model"]], instances, where) if fields["mig_enabled"] else ()
        result.append(Gpu(index=index, mig_devices=tuple(mig_devices), **fields))
    _unique(source, result, "uuid")

    imex = ctx.integer(raw.get("imex_channels", 2), "imex_channels", 0, 2048)
    nvswitches = ctx.integer(raw.get("nvswitches", 0), "nvswitches", 0, 64)
    digest = hashlib.sha256(json.dumps([raw, gpus, mig], sort_keys=True, default=str).encode()).hexdigest()
    return Topology(name=str(raw.get("name", "simulated node")), gpus=tuple(result), profiles=profiles,
                    imex_channels=imex, nvswitches=nvswitches, sha256=digest)


class _Ctx:
    """Typed accessors that turn bad values into one-line errors naming the key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str) -> NoReturn:
        raise TopologyError(f"{self.source}: {where}: {msg}")

    def mapping(self, value, where):
        if not isinstance(value, Mapping):
            self.fail(where, "must be a JSON object")
        return value

    def list(self, value, where):
        if not isinstance(value, list):
            self.fail(where, "must be a JSON array")
        return value

    def string(self, value, where, *, max_len: int = 95):
        if not isinstance(value, str) or not value:
            self.fail(where, "must be a non-empty string")
        if len(value) > max_len or not _PRINTABLE.match(value):
            self.fail(where, f"must be printable ASCII of at most {max_len} characters")
        return value

    def integer(self, value, where, lo: int = 0, hi: int = 2**63 - 1):
        if isinstance(value, str):
            try:
                value = int(value, 0)
            except ValueError:
                self.fail(where, f"not an integer: {value!r}")
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(where, f"must be an integer in [{lo}, {hi}]")
        return value

    def boolean(self, value, where):
        if not isinstance(value, bool):
            self.fail(where, "must be true or false")
        return value


def _scale(entries: list, count: int, source: str) -> list:
    if not 1 <= count <= MAX_GPU_MINOR + 1:
        raise TopologyError(f"{source}: gpus: the number of GPUs must be in [1, {MAX_GPU_MINOR + 1}]")
    if count <= len(entries):
        return entries[:count]
    scaled = []
    for i in range(count):
        entry = {"model": entries[0].get("model"), "minor": i,
                 "bus_id": f"{i // len(_SYNTHETIC_BUSES):04x}:{_SYNTHETIC_BUSES[i % len(_SYNTHETIC_BUSES)]:02x}:00.0"}
        if i < len(entries) and "mig" in entries[i]:
            entry["mig"] = entries[i]["mig"]
        scaled.append(entry)
    return scaled


def _profiles(ctx: _Ctx, model: Mapping, where: str) -> tuple:
    mig = model.get("mig")
    if mig is None:
        return ()
    mig = ctx.mapping(mig, f"{where}.mig")
    slices = ctx.integer(mig.get("memory_slices", 8), f"{where}.mig.memory_slices", 1, 8)
    out = []
    for i, p in enumerate(ctx.list(mig.get("profiles", []), f"{where}.mig.profiles")):
        w = f"{where}.mig.profiles[{i}]"
        p = ctx.mapping(p, w)
        placements = tuple(ctx.integer(x, f"{w}.placements", 0, slices - 1)
                           for x in ctx.list(p.get("placements"), f"{w}.placements"))
        gi_ids = tuple(ctx.integer(x, f"{w}.gi_ids", 0, MIG_MAX_GI)
                       for x in ctx.list(p.get("gi_ids"), f"{w}.gi_ids"))
        if len(placements) != len(gi_ids) or not placements:
            ctx.fail(w, "placements and gi_ids must be non-empty and of the same length")
        constant = ctx.integer(p.get("profile"), f"{w}.profile", 0, 31)
        prof = MigProfile(
            name=ctx.string(p.get("name"), f"{w}.name", max_len=40),
            profile=constant,
            id=ctx.integer(p.get("id"), f"{w}.id", 0, 63),
            slices=ctx.integer(p.get("slices"), f"{w}.slices", 1, slices),
            max=ctx.integer(p.get("max", 1), f"{w}.max", 1, 8),
            multiprocessors=ctx.integer(p.get("multiprocessors"), f"{w}.multiprocessors", 1, 1024),
            memory_mib=ctx.integer(p.get("memory_mib"), f"{w}.memory_mib", 1),
            placement_size=ctx.integer(p.get("placement_size", 1), f"{w}.placement_size", 1, slices),
            placements=placements,
            gi_ids=gi_ids,
            gfx=ctx.boolean(p.get("gfx", constant in _GFX_PROFILES), f"{w}.gfx"),
        )
        if prof.slices not in _CI_PROFILE_BY_SLICES:
            ctx.fail(f"{w}.slices", f"no compute-instance profile has {prof.slices} slices")
        out.append(prof)
    return tuple(out)


def _gpu_fields(ctx: _Ctx, entry: Mapping, model: Mapping, key: str, where: str, mig: bool) -> dict:
    bus_id = ctx.string(entry.get("bus_id"), f"{where}.bus_id")
    m = _BUS_ID.match(bus_id)
    if not m:
        ctx.fail(f"{where}.bus_id", f"invalid PCI bus id {bus_id!r} (expected like 0000:1b:00.0)")
    domain, bus, device, function = (int(x, 16) for x in m.groups())
    if device > 0x1F:
        ctx.fail(f"{where}.bus_id", f"invalid PCI device number in {bus_id!r}")
    proc_bus = f"{domain:04x}:{bus:02x}:{device:02x}.{function}"
    minor = ctx.integer(entry.get("minor"), f"{where}.minor", 0, MAX_GPU_MINOR)
    name = ctx.string(model.get("name"), f"models.{key}.name")
    gpu_uuid = entry.get("uuid") or "GPU-" + str(_uuid.uuid5(_UUID_NAMESPACE, f"{name}/{proc_bus}"))
    if not isinstance(gpu_uuid, str) or not _GPU_UUID.match(gpu_uuid):
        ctx.fail(f"{where}.uuid", f"invalid GPU UUID {gpu_uuid!r} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    cc = ctx.string(model.get("compute_capability"), f"models.{key}.compute_capability")
    if not re.match(r"^\d+\.\d+$", cc):
        ctx.fail(f"models.{key}.compute_capability", f"expected MAJOR.MINOR, got {cc!r}")
    mig_model = model.get("mig")
    mig_entry = ctx.mapping(entry.get("mig", {}), f"{where}.mig")
    enabled = ctx.boolean(mig_entry.get("enabled", False), f"{where}.mig.enabled") and mig
    if enabled and mig_model is None:
        ctx.fail(f"{where}.mig.enabled", f"model {key!r} has no MIG profiles")
    if enabled and minor > MIG_MAX_GPU_MINOR:
        ctx.fail(f"{where}.mig.enabled", f"MIG needs a device minor <= {MIG_MAX_GPU_MINOR}, not {minor}")
    instances = ctx.list(mig_entry.get("instances", []), f"{where}.mig.instances")
    serial_seed = int(hashlib.sha256(gpu_uuid.encode()).hexdigest(), 16)
    mem = ctx.integer(model.get("memory_mib"), f"models.{key}.memory_mib", 1)
    sms = ctx.integer(model.get("multiprocessors"), f"models.{key}.multiprocessors", 1, 4096)
    return {
        "minor": minor,
        "uuid": gpu_uuid,
        "bus_id": proc_bus,
        "domain": domain, "bus": bus, "device": device, "function": function,
        "name": name,
        "pci_device_id": ctx.integer(model.get("pci_device_id"), f"models.{key}.pci_device_id", 0, 0xFFFFFFFF),
        "pci_subsystem_id": ctx.integer(model.get("pci_subsystem_id", 0), f"models.{key}.pci_subsystem_id",
                                        0, 0xFFFFFFFF),
        "brand": ctx.integer(model.get("brand", 14), f"models.{key}.brand", 0, max(BRAND_NAMES)),
        "architecture": ctx.integer(model.get("architecture"), f"models.{key}.architecture", 0, 255),
        "cc_major": int(cc.split(".")[0]),
        "cc_minor": int(cc.split(".")[1]),
        "memory_mib": mem,
        "reserved_mib": ctx.integer(model.get("reserved_mib", 0), f"models.{key}.reserved_mib", 0, mem),
        "multiprocessors": sms,
        "cores": ctx.integer(model.get("cores", sms * 128), f"models.{key}.cores", 1),
        "vbios": ctx.string(model.get("vbios", "00.00.00.00.01"), f"models.{key}.vbios", max_len=31),
        "board_part_number": ctx.string(model.get("board_part_number", "000-00000-0000-000"),
                                        f"models.{key}.board_part_number", max_len=79),
        "serial": ctx.string(entry.get("serial", f"16549220{serial_seed % 10**5:05d}"), f"{where}.serial",
                             max_len=29),
        "power_limit_mw": ctx.integer(model.get("power_limit_mw", 300000), f"models.{key}.power_limit_mw", 1),
        "dma_bits": ctx.integer(model.get("dma_bits", 47), f"models.{key}.dma_bits", 32, 64),
        "irq": ctx.integer(entry.get("irq", 176 + 8 * minor), f"{where}.irq", 0, 65535),
        "model": key,
        "mig_capable": mig_model is not None,
        "mig_enabled": enabled,
        "max_mig_devices": ctx.integer(mig_model.get("max_devices", 7), f"models.{key}.mig.max_devices", 1, 8)
        if isinstance(mig_model, Mapping) else 0,
        "memory_slices": ctx.integer(mig_model.get("memory_slices", 8), f"models.{key}.mig.memory_slices", 1, 8)
        if isinstance(mig_model, Mapping) else 0,
        "persistence_mode": ctx.boolean(entry.get("persistence_mode", True), f"{where}.persistence_mode"),
        "_instances": instances,
        "_where": where,
    }


def _place(ctx: _Ctx, gpu: dict, profiles: tuple, instances: list, where: str) -> list:
    """Create GPU instances like ``nvidia-smi mig -cgi``: highest free placement first."""
    by_name = {p.name: p for p in profiles}
    used = [False] * gpu["memory_slices"]
    taken: list[tuple] = []
    for i, inst in enumerate(instances):
        w = f"{where}.mig.instances[{i}]"
        name = inst.get("profile") if isinstance(inst, Mapping) else inst
        if name not in by_name:
            ctx.fail(w, f"unknown MIG profile {name!r} (known: {', '.join(by_name)})")
        prof = by_name[name]
        if sum(1 for t in taken if t[0] is prof) >= prof.max:
            ctx.fail(w, f"at most {prof.max} instance(s) of {name} fit on a GPU")
        for slot in sorted(range(len(prof.placements)), key=lambda s: -prof.placements[s]):
            start = prof.placements[slot]
            span = range(start, min(start + prof.placement_size, len(used)))
            if not any(used[s] for s in span) and all(t[1] != prof.gi_ids[slot] for t in taken):
                for s in span:
                    used[s] = True
                taken.append((prof, prof.gi_ids[slot], start))
                break
        else:
            ctx.fail(w, f"no free placement left for MIG profile {name}")
    if len(taken) > gpu["max_mig_devices"]:
        ctx.fail(f"{where}.mig.instances", f"at most {gpu['max_mig_devices']} MIG devices fit on a GPU")
    devices = []
    for index, (prof, gi, start) in enumerate(sorted(taken, key=lambda t: t[1])):
        ci = 0
        mig_uuid = "MIG-" + str(_uuid.uuid5(_UUID_NAMESPACE, f"{gpu['uuid']}/gi{gi}/ci{ci}"))
        devices.append(MigDevice(
            index=index, gi=gi, ci=ci, uuid=mig_uuid, profile=prof.name,
            name=f"{gpu['name']} MIG {prof.name}",
            gi_profile=prof.profile, gi_profile_id=prof.id,
            ci_profile=prof.ci_profile,
            placement_start=start, placement_size=prof.placement_size, slices=prof.slices,
            multiprocessors=prof.multiprocessors, memory_mib=prof.memory_mib,
            gi_cap_minor=gi_cap_minor(gpu["minor"], gi), ci_cap_minor=ci_cap_minor(gpu["minor"], gi, ci),
            gfx=prof.gfx,
        ))
    return devices


def _unique(source: str, items: list, key: str) -> None:
    seen = set()
    for item in items:
        value = item[key] if isinstance(item, dict) else getattr(item, key)
        if value in seen:
            raise TopologyError(f"{source}: gpus: two GPUs have {key} {value!r}")
        seen.add(value)
