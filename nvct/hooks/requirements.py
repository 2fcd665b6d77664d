"""The requirements step: NVIDIA_REQUIRE_* checked for specs that native CDI consumers apply."""

from __future__ import annotations

from nvct.edits import steps as kinds
from nvct.hooks.container import HookContext, spec_env

#: The chain step that enforces NVIDIA_REQUIRE_* for specs that native CDI consumers apply.
REQUIREMENTS_STEP = kinds.CheckRequirements.name


def check_requirements(step: kinds.CheckRequirements, ctx: HookContext) -> None:
    """``--driver-version V [--cuda-version C] [--gpu /dev/nvidiaN::ARCH::BRAND]...``: refuse a
    container whose ``NVIDIA_REQUIRE_*`` this node cannot satisfy (nvct.request.requirements).

    The first step of a generated spec's chain, so podman, containerd and docker's
    CDI path enforce what jit-cdi and legacy mode do, in the process that runs
    anyway. The facts are the node's when the spec was generated (the refresh
    unit regenerates it when the driver changes); ``arch`` and ``brand`` are those
    of the ``--gpu`` nodes the container's spec has.
    """
    env = spec_env(ctx.spec)
    if "CUDA_VERSION" not in env and not any(k.startswith("NVIDIA_REQUIRE_") for k in env):
        return  # nothing asked: not even the parser's import on this start
    from nvct.request import requirements

    if not requirements.collect(env):  # NVIDIA_DISABLE_REQUIRE
        return
    present = _spec_device_paths(ctx.spec)
    devices = [(arch or None, brand or None) for path, arch, brand in step.gpus if path in present]
    facts = requirements.DriverFacts(cuda=step.cuda_version or None,
                                     driver=step.driver_version or None, devices=devices)
    requirements.check(env, facts)


def _spec_device_paths(spec: dict) -> set[str]:
    """The container paths of the spec's device nodes (and of nodes bind-mounted, as rootless podman does)."""
    linux = spec.get("linux") if isinstance(spec, dict) else None
    found = linux.get("devices") if isinstance(linux, dict) else None
    out = {d["path"] for d in found if isinstance(d, dict) and isinstance(d.get("path"), str)} \
        if isinstance(found, list) else set()
    mounts = spec.get("mounts") if isinstance(spec, dict) else None
    for m in mounts if isinstance(mounts, list) else ():
        if isinstance(m, dict) and isinstance(m.get("destination"), str) and m["destination"].startswith("/dev/"):
            out.add(m["destination"])
    return out
