"""Everything the driver offers, as one plain structure (``nvct list``/``info``, doctor).

Paths are as a container sees them (relative to the driver or device root).
"""

from __future__ import annotations

import os

from nvct.base.errors import DriverError, NvctError
from nvct.discover.driver import BINARIES, Driver, Node
from nvct.linux import elf

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any


def gpus(driver: Driver, *, with_nvml: bool = True) -> list[dict[str, Any]]:
    """GPUs and their MIG devices; MIG UUIDs come from NVML when it loads."""
    mig_uuids: dict[tuple[int, int], str] = {}
    if with_nvml:
        try:
            mig_uuids = {v: k for k, v in driver.mig_uuids.items()}
        except DriverError:
            mig_uuids = {}
    out = []
    for gpu in driver.gpus:
        out.append({
            "index": gpu.index, "minor": gpu.minor, "uuid": gpu.uuid, "bus_id": gpu.bus_id,
            "model": gpu.model, "mig_enabled": gpu.mig_enabled,
            "mig_devices": [{
                "index": m.index, "name": m.name, "gi": m.gi, "ci": m.ci,
                "uuid": mig_uuids.get((gpu.index, m.index)),
                "gi_cap_minor": m.gi_cap_minor, "ci_cap_minor": m.ci_cap_minor,
            } for m in gpu.migs],
        })
    return out


def device_nodes(driver: Driver) -> list[dict[str, Any]]:
    """Every NVIDIA device node a container could be given."""
    nodes: list[tuple[str, Node]] = [("gpu", driver.gpu_node(g)) for g in driver.gpus]
    for node in driver.control_nodes():
        role = {"/dev/nvidiactl": "control", "/dev/nvidia-modeset": "modeset"}.get(node.path, "uvm")
        nodes.append((role, node))
    if "nvidia-caps" in driver.majors:
        for minor, role in ((1, "mig-config"), (2, "mig-monitor")):
            nodes.append((role, driver.cap_node(minor)))
        for gpu in driver.gpus:
            for mig in gpu.migs:
                nodes.append(("mig-access", driver.cap_node(mig.gi_cap_minor)))
                nodes.append(("mig-access", driver.cap_node(mig.ci_cap_minor)))
    for gpu in driver.gpus:
        nodes.extend(("dri", n) for n in driver.drm_nodes(gpu))
    if "nvidia-caps-imex-channels" in driver.majors:
        for node in driver.glob_nodes("/dev/nvidia-caps-imex-channels/channel*"):
            nodes.append(("imex-channel", node))
    seen = set()
    out = []
    for role, node in nodes:
        if node.path in seen or not os.path.exists(node.host_path):
            continue
        seen.add(node.path)
        out.append({"path": node.path, "type": "c", "major": node.major, "minor": node.minor,
                    "mode": f"{node.file_mode:04o}" if node.file_mode is not None else None, "role": role})
    return out


def _elf_facts(path: str) -> dict[str, Any]:
    """What the file itself says (nvct.linux.elf): the ld cache's key and flags must agree with it."""
    try:
        info = elf.read(path)
    except NvctError as e:
        return {"error": str(e)}
    return {"class": info.elf_class, "machine": info.machine, "soname": info.soname}


def listing(driver: Driver) -> dict[str, Any]:
    """What ``nvct list --json`` prints."""
    caps = sorted(BINARIES)
    return {
        "driver_version": driver.version,
        "roots": {"driver_root": driver.driver_root, "dev_root": driver.dev_root, "proc_root": driver.proc_root},
        "device_nodes": device_nodes(driver),
        "libraries": [dict(path=lib.path, soname=lib.soname, capability=lib.capability, arch=lib.arch,
                           elf=_elf_facts(driver.host_path(lib.path)))
                      for lib in driver.all_libraries],
        "binaries": [{"path": p, "capability": cap} for cap in caps for p in driver.binaries([cap])],
        "ipc": driver.ipc(["utility", "compute"]),
        "firmware": driver.firmware(),
    }


def info(driver: Driver) -> dict[str, Any]:
    """What ``nvct info --json`` prints: driver and CUDA versions, GPUs."""
    out: dict[str, Any] = {"driver_version": driver.version, "cuda_version": None, "nvml": None}
    try:
        with driver.nvml() as nvml:
            out["cuda_version"] = nvml.cuda_driver_version()
            out["nvml"] = "ok"
    except DriverError as e:
        out["nvml"] = str(e)
    out["gpus"] = gpus(driver, with_nvml=out["nvml"] == "ok")
    return out
