"""/proc files of a simulated node, in the kernel module's exact formats.

Parsers are sensitive to whitespace (the version line's double spaces and
trailing space, the information file's tabs), so the templates here are
byte-for-byte what the module prints.
"""

from __future__ import annotations

import os

from nvct.simulate import devices
from nvct.simulate.driver import GCC_VERSION, Driver
from nvct.simulate.topology import MIG_MAX_CI, MIG_MAX_GI, MIG_MAX_GPU_MINOR, Gpu, Topology, ci_cap_minor, gi_cap_minor

#: /proc/driver/nvidia/params of a 550 module; older and newer ones differ slightly (see _params).
_PARAMS_550 = [
    ("ResmanDebugLevel", 4294967295), ("RmLogonRC", 1), ("ModifyDeviceFiles", 1), ("DeviceFileUID", 0),
    ("DeviceFileGID", 0), ("DeviceFileMode", 438), ("InitializeSystemMemoryAllocations", 1),
    ("UsePageAttributeTable", 4294967295), ("EnableMSI", 1), ("EnablePCIeGen3", 0), ("MemoryPoolSize", 0),
    ("KMallocHeapMaxSize", 0), ("VMallocHeapMaxSize", 0), ("IgnoreMMIOCheck", 0), ("TCEBypassMode", 0),
    ("EnableStreamMemOPs", 0), ("EnableUserNUMAManagement", 1), ("NvLinkDisable", 0),
    ("RmProfilingAdminOnly", 1), ("PreserveVideoMemoryAllocations", 0), ("EnableS0ixPowerManagement", 0),
    ("S0ixPowerManagementVideoMemoryThreshold", 256), ("DynamicPowerManagement", 3),
    ("DynamicPowerManagementVideoMemoryThreshold", 200), ("RegisterPCIDriver", 1),
    ("EnablePCIERelaxedOrderingMode", 0), ("EnableResizableBar", 0), ("EnableGpuFirmware", 18),
    ("EnableGpuFirmwareLogs", 2), ("RmNvlinkBandwidthLinkCount", 0), ("EnableDbgBreakpoint", 0),
    ("OpenRmEnableUnsupportedGpus", 1), ("DmaRemapPeerMmio", 1), ("ImexChannelCount", 2048),
    ("CreateImexChannel0", 0), ("GrdmaPciTopoCheckOverride", 0), ("RegistryDwords", '""'),
    ("RegistryDwordsPerDevice", '""'), ("RmMsg", '""'), ("GpuBlacklist", '""'), ("TemporaryFilePath", '""'),
    ("ExcludedGpus", '""'),
]
_NEW_IN_550 = {"RmNvlinkBandwidthLinkCount", "ImexChannelCount", "CreateImexChannel0", "GrdmaPciTopoCheckOverride"}


def files(drv: Driver, topo: Topology, arch: str = "x86_64") -> dict:
    """Every /proc file, as path relative to the proc root -> (content, mode)."""
    out = {
        "devices": (devices.proc_devices(drv, topo), 0o444),
        "driver/nvidia/version": (version(drv, arch), 0o444),
        "driver/nvidia/params": (_params(drv), 0o444),
        "driver/nvidia/registry": ('Binary: ""\n', 0o444),
        "driver/nvidia/capabilities/mig/config": (_cap(1, 0o400), 0o400),
        "driver/nvidia/capabilities/mig/monitor": (_cap(2, 0o444), 0o444),
        "driver/nvidia-caps/mig-minors": (mig_minors(), 0o444),
        "driver/nvidia-caps/sys-minors": ("fabric-imex-mgmt 1\n", 0o444),
    }
    for g in topo.gpus:
        out[f"driver/nvidia/gpus/{g.bus_id}/information"] = (information(drv, g), 0o444)
        out[f"driver/nvidia/gpus/{g.bus_id}/registry"] = ('Binary: ""\n', 0o444)
        base = f"driver/nvidia/capabilities/gpu{g.minor}/mig"
        for m in g.mig_devices:
            out[f"{base}/gi{m.gi}/access"] = (_cap(m.gi_cap_minor, 0o444), 0o444)
            out[f"{base}/gi{m.gi}/ci{m.ci}/access"] = (_cap(m.ci_cap_minor, 0o444), 0o444)
    return out


def write(proc_root: str, drv: Driver, topo: Topology, arch: str = "x86_64") -> None:
    for rel, (content, mode) in files(drv, topo, arch).items():
        path = os.path.join(proc_root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="ascii") as f:
            f.write(content)
        os.chmod(path, mode)


def version(drv: Driver, arch: str = "x86_64") -> str:
    if arch != "x86_64":  # Grace nodes run the open kernel module only, which names the arch this way
        return (f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {drv.version}  Release Build  "
                f"(dvs-builder@U16-I3-B13-02-1)  {drv.build_date}\n"
                f"GCC version:  {GCC_VERSION} \n")
    return (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {drv.version}  {drv.build_date}\n"
            f"GCC version:  {GCC_VERSION} \n")


def information(drv: Driver, g: Gpu) -> str:
    mask = (1 << g.dma_bits) - 1
    return (f"Model: \t\t {g.name}\n"
            f"IRQ:   \t\t {g.irq}\n"
            f"GPU UUID: \t {g.uuid}\n"
            f"Video BIOS: \t {g.vbios}\n"
            f"Bus Type: \t PCIe\n"
            f"DMA Size: \t {g.dma_bits} bits\n"
            f"DMA Mask: \t {mask:#x}\n"
            f"Bus Location: \t {g.bus_id}\n"
            f"Device Minor: \t {g.minor}\n"
            f"GPU Firmware: \t {drv.version if drv.has_gsp_firmware else 'N/A'}\n"
            f"GPU Excluded:\t No\n")


def mig_minors() -> str:
    """The module's static table: every GPU/GI/CI access capability and its minor."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(MIG_MAX_GPU_MINOR + 1):
        for gi in range(MIG_MAX_GI + 1):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_cap_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {ci_cap_minor(gpu, gi, ci)}" for ci in range(MIG_MAX_CI + 1)]
    return "\n".join(lines) + "\n"


def _cap(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _params(drv: Driver) -> str:
    params = list(_PARAMS_550)
    if drv.branch < 550:
        params = [p for p in params if p[0] not in _NEW_IN_550]
    if drv.branch >= 570:
        params.insert(params.index(("RegistryDwords", '""')), ("RmNvlinkBandwidth", '""'))
    return "".join(f"{k}: {v}\n" for k, v in params)
