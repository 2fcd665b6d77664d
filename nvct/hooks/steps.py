"""The one executor of the in-container steps, each working only through the container's Rootfs.

Every path comes from the spec nvct wrote, but the rootfs itself belongs to
the image, so all file operations go through :class:`nvct.rootfs.root.Rootfs`,
which cannot be led outside the root by a symlink. The chain's steps share
one, opened once (``HookContext.root``): the root's own path is looked up a
single time, so it cannot be swapped between two steps.
"""

from __future__ import annotations

import sys

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Callable, Sequence

    from nvct.hooks.container import HookContext


def run(steps: Sequence[kinds.Step], ctx: HookContext) -> None:
    """The one executor: each step in order (the hook's chain, the shim's early steps, legacy's)."""
    for step in steps:
        if isinstance(step, kinds.Invalid):
            raise NvctError(step.error)
        if isinstance(step, kinds.Unknown):
            sys.stderr.write(f"nvct hook: unknown hook {step.name!r}, ignored (from a newer nvct?)\n")
            continue
        runner(type(step))(step, ctx)


def run_chain(args: list[str], ctx: HookContext) -> None:
    """Run ``name args... [-- name args...]...`` in order (nvct.edits.steps.parse reads them)."""
    run(kinds.parse(args), ctx)


#: Each step's runner: its module under nvct.hooks, imported when such a step runs (a jit-cdi
#: start's hook runs only the params mask: six of these modules would be imported for nothing).
_RUNNERS: dict[type, tuple[str, str]] = {
    kinds.CreateSymlinks: ("files", "create_symlinks"),
    kinds.EnableCudaCompat: ("compat", "enable_cuda_compat"),
    kinds.UpdateLdcache: ("ldcache", "update_ldcache"),
    kinds.CreateSonameSymlinks: ("ldcache", "create_soname_symlinks"),
    kinds.MaskParams: ("procmask", "disable_device_node_modification"),
    kinds.Chmod: ("files", "chmod"),
    kinds.UpdateApplicationProfile: ("files", "update_application_profile"),
    kinds.BindMount: ("mounts", "bind_mount"),
    kinds.ReadonlyRoot: ("mounts", "readonly_root"),
    kinds.ApplyCudaMemoryLimits: ("limits", "apply_cuda_memory_limits"),
    kinds.CheckRequirements: ("requirements", "check_requirements"),
}


def runner(kind: type) -> Callable:
    """The function that runs steps of ``kind``."""
    module, name = _RUNNERS[kind]
    return getattr(__import__(f"nvct.hooks.{module}", fromlist=[name]), name)


#: Every hook name nvct runs (the reference's, and nvct's own).
STEPS = kinds.NAMES
