"""The GPU memory limits step: the container's request and limit, set by NVML for its cgroup."""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds
from nvct.hooks.container import HookContext, spec_env


def apply_cuda_memory_limits(step: kinds.ApplyCudaMemoryLimits, ctx: HookContext) -> None:
    """``--driver-root R --gpu-id UUID...``: the container's GPU memory request and limit, set by NVML.

    A createRuntime hook (the reference's): the container's process exists and
    is in its cgroup. With both ``NVIDIA_GPUkinds.MEMORY_REQUEST(S)`` and
    ``NVIDIA_GPUkinds.MEMORY_LIMIT(S)`` (MiB) in its env, each ``--gpu-id`` GPU gets
    them as soft and hard limits for the container's cgroup v2 directory
    (``nvmlDeviceSetMemoryLimits_v1``). The cgroup is the one the kernel lists
    for the container's process, so cgroupfs paths work as well as systemd's.
    """
    from nvct.base.errors import ContainerError
    from nvct.linux import cgroups

    env = spec_env(ctx.spec)
    request = next((env[n] for n in kinds.MEMORY_REQUEST if n in env), None)
    limit = next((env[n] for n in kinds.MEMORY_LIMIT if n in env), None)
    if request is None and limit is None:
        return
    if request is None or limit is None:
        missing = kinds.MEMORY_REQUEST[1] if request is None else kinds.MEMORY_LIMIT[1]
        sys.stderr.write(f"apply-cuda-memory-limits: {missing} is not set; no GPU memory limit is applied\n")
        return
    soft, hard = _mib(kinds.MEMORY_REQUEST[1], request), _mib(kinds.MEMORY_LIMIT[1], limit)
    if soft > hard:
        raise NvctError(f"apply-cuda-memory-limits: the GPU memory request ({soft} MiB) exceeds the limit ({hard} MiB)")
    gpus = list(step.gpu_ids)
    if any(not g.strip() for g in gpus):
        raise NvctError("apply-cuda-memory-limits: --gpu-id must not be empty")
    if not gpus:
        return
    if ctx.pid is None:
        raise ContainerError("apply-cuda-memory-limits: the OCI state names no pid (run it as a createRuntime hook)")
    if cgroups.cgroup_version(ctx.pid) != 2:
        raise ContainerError("apply-cuda-memory-limits: GPU memory limits need cgroup v2 "
                             "(/sys/fs/cgroup is not cgroup2)")
    cgroup = cgroups.unified_cgroup_dir(ctx.pid)
    _set_memory_limits(step.driver_root or "/", gpus, cgroup, soft << 20, hard << 20)


def _set_memory_limits(driver_root: str, gpus: list[str], cgroup: str, soft: int, hard: int) -> None:
    from nvct.base.errors import DriverError
    from nvct.discover import nvml

    library = nvml.find_library(driver_root, None, os.uname().machine)
    if library is None:
        raise DriverError(f"apply-cuda-memory-limits: no libnvidia-ml.so.1 under the driver root {driver_root}")
    with nvml.Nvml(library) as lib:
        for uuid in gpus:
            lib.set_memory_limits(lib.handle_by_uuid(uuid), cgroup, soft, hard)


def _mib(name: str, value: str) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) >= 1 << 44:
        raise NvctError(f"apply-cuda-memory-limits: {name}={value!r} is not a whole number of MiB")
    return int(text)
