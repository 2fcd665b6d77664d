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
from nvct.hooks.compat import enable_cuda_compat
from nvct.hooks.container import HookContext
from nvct.hooks.files import chmod, create_symlinks, update_application_profile
from nvct.hooks.ldcache import create_soname_symlinks, update_ldcache
from nvct.hooks.limits import apply_cuda_memory_limits
from nvct.hooks.mounts import bind_mount, readonly_root
from nvct.hooks.procmask import disable_device_node_modification
from nvct.hooks.requirements import check_requirements

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Callable, Sequence


def run(steps: Sequence[kinds.Step], ctx: HookContext) -> None:
    """The one executor: each step in order (the hook's chain, the shim's early steps, legacy's)."""
    for step in steps:
        if isinstance(step, kinds.Invalid):
            raise NvctError(step.error)
        if isinstance(step, kinds.Unknown):
            sys.stderr.write(f"nvct hook: unknown hook {step.name!r}, ignored (from a newer nvct?)\n")
            continue
        _RUNNERS[type(step)](step, ctx)


def run_chain(args: list[str], ctx: HookContext) -> None:
    """Run ``name args... [-- name args...]...`` in order (nvct.edits.steps.parse reads them)."""
    run(kinds.parse(args), ctx)


_RUNNERS: dict[type, Callable] = {
    kinds.CreateSymlinks: create_symlinks,
    kinds.EnableCudaCompat: enable_cuda_compat,
    kinds.UpdateLdcache: update_ldcache,
    kinds.CreateSonameSymlinks: create_soname_symlinks,
    kinds.MaskParams: disable_device_node_modification,
    kinds.Chmod: chmod,
    kinds.UpdateApplicationProfile: update_application_profile,
    kinds.BindMount: bind_mount,
    kinds.ReadonlyRoot: readonly_root,
    kinds.ApplyCudaMemoryLimits: apply_cuda_memory_limits,
    kinds.CheckRequirements: check_requirements,
}

#: Every hook name nvct runs (the reference's, and nvct's own).
STEPS = kinds.NAMES
