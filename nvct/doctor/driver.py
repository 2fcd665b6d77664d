"""The kernel module and what it shows: /proc/driver/nvidia, the version, the GPUs, NVML.

Everything here is read from procfs, which never opens a GPU. NVML is only
loaded and initialized; with ``--deep`` it is also asked about each GPU.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import NvctError
from nvct.discover import procfs
from nvct.doctor.model import Context, fail, ok, warn

_LOAD_FIX = "modprobe nvidia && modprobe nvidia-uvm (install the driver's kernel modules first if that fails)"


def check_module(ctx: Context):
    """The module is loaded when its procfs directory and version file exist.

    /proc/modules is only a second witness: many nodes do not have it.
    """
    if ctx.driver is None:
        yield ctx.skipped("driver.module", "nvct's config does not load (see config.file)")
        return
    proc = ctx.driver.proc_root
    if not os.path.isdir(proc):
        yield fail("driver.module", f"the proc root {proc} does not exist",
                   ctx.set_command("nvct.proc-root", "/proc") + " (or the directory where the host's /proc is)")
        return
    base = os.path.join(proc, "driver/nvidia")
    listed = _listed_in_modules(proc)
    if not os.path.isdir(base):
        also = "; /proc/modules lists nvidia, so the proc root may not be the host's /proc" if listed else ""
        yield fail("driver.module", f"no {base}: the NVIDIA kernel module is not loaded{also}", _LOAD_FIX)
        return
    version_file = os.path.join(base, "version")
    if not os.path.isfile(version_file):
        yield fail("driver.module", f"{base} exists but has no version file", _LOAD_FIX)
        return
    witness = " and /proc/modules lists it" if listed else ""
    yield ok("driver.module", f"NVIDIA kernel module loaded: {version_file} present{witness}")


def check_version(ctx: Context):
    if ctx.driver is None or not os.path.isfile(os.path.join(ctx.driver.proc_root, "driver/nvidia/version")):
        yield ctx.skipped("driver.version", "no kernel module (see driver.module)")
        return
    if ctx.version is None:
        yield fail("driver.version", ctx.version_error or "", "reload the module: " + _LOAD_FIX)
        return
    yield ok("driver.version", f"driver version {ctx.version}")


def check_gpus(ctx: Context):
    if ctx.version is None:
        yield ctx.skipped("driver.gpus", "no driver version (see driver.module)")
        return
    if ctx.gpus is None:
        yield fail("driver.gpus", ctx.gpus_error or "", "reload the module: " + _LOAD_FIX)
        return

    excluded = [g for g in procfs.gpus(ctx.driver.proc_root) if g.excluded]
    if excluded:
        yield warn("driver.gpus", f"{len(excluded)} GPU(s) excluded by the driver: "
                   f"{', '.join(g.bus_id for g in excluded)}",
                   "check the kernel log (dmesg | grep NVRM) and NVreg_ExcludedGpus")
    gpus = ctx.gpus
    if not gpus:
        yield fail("driver.gpus", f"no GPU in {ctx.driver.proc_root}/driver/nvidia/gpus: containers that ask for "
                   "one fail to start (unknown device)",
                   "check that the GPUs are seen (lspci -d 10de:) and the kernel log (dmesg | grep NVRM)")
        return
    migs = sum(len(g.migs) for g in gpus)
    models = sorted({g.model for g in gpus})
    more = f", {migs} MIG device(s)" if migs else ""
    yield ok("driver.gpus", f"{len(gpus)} GPU(s) in procfs ({', '.join(models)}){more}")


def check_nvml(ctx: Context):
    """dlopen + nvmlInit; with --deep, the GPUs NVML sees must be procfs's."""
    if ctx.version is None:
        yield ctx.skipped("driver.nvml", "no driver version (see driver.module)")
        return
    if why := ctx.missing_root("driver"):  # NVML is loaded from the driver root
        yield ctx.skipped("driver.nvml", why)
        return
    if ctx.empty_driver_root:
        yield ctx.skipped("driver.nvml", f"{ctx.empty_driver_root} (see config.roots)")
        return
    try:
        with ctx.driver.nvml() as nvml:
            nvml_version = nvml.driver_version()
            yield _nvml_version_finding(ctx, nvml_version)
            if ctx.options.deep:
                yield from _nvml_devices(ctx, nvml)
    except NvctError as e:
        control = ctx.driver.dev_host_path("/dev/nvidiactl")
        if not os.path.exists(control):  # the host's NVML needs it; containers get theirs made by the runtime
            yield warn("driver.nvml", f"NVML on this host does not initialize ({e}): {control} is missing. "
                       "Containers still get their GPUs (see devices.nodes)", "see devices.nodes")
            return
        yield fail("driver.nvml", f"NVML does not load or initialize: {e}", _nvml_fix(ctx, str(e)))


def _nvml_version_finding(ctx: Context, nvml_version: str):
    if nvml_version != ctx.version:
        return fail("driver.nvml", f"NVML is {nvml_version} but the kernel module is {ctx.version} "
                    f"(\"Failed to initialize NVML: Driver/library version mismatch\")",
                    f"reboot to load the {nvml_version} module, or reinstall the {ctx.version} "
                    f"user-space libraries")
    return ok("driver.nvml", f"NVML {nvml_version} loads and initializes")


def _nvml_devices(ctx: Context, nvml):
    procfs_uuids = [g.uuid for g in ctx.gpus or ()]
    try:
        uuids = [nvml.uuid(nvml.handle_by_index(i)) for i in range(nvml.device_count())]
    except NvctError as e:
        yield fail("driver.nvml-devices", f"NVML cannot list the GPUs: {e}",
                   "check the kernel log (dmesg | grep NVRM): a GPU may have fallen off the bus")
        return
    if sorted(uuids) != sorted(procfs_uuids):
        missing = sorted(set(procfs_uuids) - set(uuids))
        seen = f"NVML sees {len(uuids)} GPU(s), procfs {len(procfs_uuids)}" + (
            f"; NVML lacks {', '.join(missing)}" if missing else "")
        nodeless = [g for g in ctx.gpus or () if g.uuid in missing and not _is_gpu_node(ctx, g)]
        if missing and len(nodeless) == len(missing):
            # This host's NVML opens the GPUs through their host nodes; runc and crun make a container's.
            yield warn("driver.nvml-devices", f"{seen}: their host device nodes "
                       f"({', '.join(f'/dev/nvidia{g.minor}' for g in nodeless)}) are missing or wrong, so "
                       f"this host's NVML and nvidia-smi do not see them. Containers still get them",
                       "see devices.nodes")
            return
        yield fail("driver.nvml-devices", seen,
                   "check the device nodes (devices.nodes) and the kernel log (dmesg | grep NVRM)")
    else:
        yield ok("driver.nvml-devices", f"NVML sees the same {len(uuids)} GPU(s) as procfs")


def _is_gpu_node(ctx: Context, gpu) -> bool:
    """Whether the dev root has ``gpu``'s node, a character device of the right number."""
    try:
        st = os.stat(ctx.driver.dev_host_path(f"/dev/nvidia{gpu.minor}"))
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == gpu.minor


def _nvml_fix(ctx: Context, error: str) -> str:
    if "not found" in error:
        return "see libraries.nvml"
    if "Driver Not Loaded" in error or "DRIVER_NOT_LOADED" in error or "code 9" in error:
        return "create the device nodes (see devices.nodes) or " + _LOAD_FIX
    return "check the kernel log (dmesg | grep NVRM); reinstall the driver if it persists"


def _listed_in_modules(proc: str) -> bool:
    try:
        with open(os.path.join(proc, "modules"), encoding="utf-8", errors="replace") as f:
            return any(line.split(" ", 1)[0] == "nvidia" for line in f)
    except OSError:
        return False


CHECKS = (check_module, check_version, check_gpus, check_nvml)
