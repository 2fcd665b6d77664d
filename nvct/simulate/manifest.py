"""The simulated node's ground truth (DIR/nvct-node.json).

Tests compare what nvct discovers (``nvct list --json``) against this. The
library list is computed the way libnvidia-container picks libraries: from
the node's real ld.so.cache, by name per capability, keeping entries whose
resolved file name ends with the driver version.
"""

from __future__ import annotations

import json
import os

from nvct.base.errors import NvctError
from nvct.linux import elf
from nvct.simulate import devices, ldcache
from nvct.simulate.datafiles import firmware_names
from nvct.simulate.driver import BINARIES, CAPABILITY_LIBRARIES, Driver
from nvct.simulate.topology import BRAND_NAMES, Topology

MANIFEST = "nvct-node.json"
CONFIG = "nvct-config.toml"
GENERATOR = "nvct simulate node"
FORMAT = 1


def load_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of the simulated node at ``directory``."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise NvctError(f"{path}: not a simulated node (no manifest)") from None
    except (OSError, ValueError) as e:
        raise NvctError(f"{path}: unreadable simulated-node manifest: {e}") from None
    if not isinstance(data, dict) or data.get("generator") != GENERATOR:
        raise NvctError(f"{path}: not a manifest written by `{GENERATOR}`")
    return data


def build(root: str, drv: Driver, topo: Topology, options: dict, nodes_created: bool,
          top_level: list[str], ldcache_root: str | None = None, arch: str = "x86_64") -> dict:
    """The manifest of a node built under ``root`` (``ldcache_root``: where it is now, if elsewhere)."""
    proc_root = os.path.join(root, "proc")
    return {
        "generator": GENERATOR,
        "format": FORMAT,
        "driver_version": drv.version,
        "cuda_version": drv.cuda_version_string,
        "cuda_driver_version": drv.cuda_version,
        "nvml_version": drv.nvml_version,
        "topology": topo.name,
        "arch": arch,
        "options": options,
        "roots": {"driver_root": root, "dev_root": root, "proc_root": proc_root},
        "gpus": [_gpu(g) for g in topo.gpus],
        "device_majors": devices.majors(drv, topo),
        "device_nodes": [n.to_dict() for n in devices.plan(topo)] if nodes_created else [],
        "libraries": libraries(ldcache_root or root, drv),
        "binaries": [{"path": f"/usr/bin/{name}", "capability": cap} for name, cap in BINARIES.items() if cap],
        "ipc": ["/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket", "/tmp/nvidia-mps"],
        "firmware": firmware_names(drv),
        "config": os.path.join(root, CONFIG),
        "top_level": top_level,
    }


def libraries(root: str, drv: Driver) -> list[dict]:
    """What libnvidia-container would pick from the node's ld.so.cache."""
    wanted = {name: cap for cap, names in CAPABILITY_LIBRARIES.items() for name in names}
    picked = {}
    for name, arch, path in ldcache.entries(root):
        lib = name.split(".so", 1)[0]
        if lib not in wanted or not name.startswith(lib + ".so"):
            continue
        resolved = _resolve(root, path)
        if resolved is None or not resolved.endswith("." + drv.version):
            continue
        picked[(arch, resolved)] = {"path": resolved, "soname": _soname_of(root, resolved, name),
                                    "capability": wanted[lib], "arch": arch}
    return sorted(picked.values(), key=lambda e: (e["arch"] == "i386", e["path"]))


def _resolve(root: str, path: str) -> str | None:
    """Follow symlinks of ``path`` inside ``root`` (never outside it)."""
    current = path
    for _ in range(16):
        full = os.path.join(root, current.lstrip("/"))
        if not os.path.islink(full):
            return current if os.path.isfile(full) else None
        target = os.readlink(full)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
    return None


def _soname_of(root: str, resolved: str, name: str) -> str:
    return elf.read(os.path.join(root, resolved.lstrip("/"))).soname or name


def _gpu(g) -> dict:
    return {
        "index": g.index,
        "minor": g.minor,
        "uuid": g.uuid,
        "bus_id": g.bus_id,
        "model": g.name,
        "arch": f"{g.cc_major}.{g.cc_minor}",
        "brand": BRAND_NAMES.get(g.brand, "unknown"),
        "brand_id": g.brand,
        "architecture": g.architecture,
        "memory_mib": g.memory_mib,
        "device_node": f"/dev/nvidia{g.minor}",
        "mig_capable": g.mig_capable,
        "mig_enabled": g.mig_enabled,
        "mig_devices": [{
            "index": m.index, "gi": m.gi, "ci": m.ci, "uuid": m.uuid, "profile": m.profile, "gfx": m.gfx,
            "name": m.name, "memory_mib": m.memory_mib, "gi_cap_minor": m.gi_cap_minor, "ci_cap_minor": m.ci_cap_minor,
        } for m in g.mig_devices],
    }
