"""Fixtures for end-to-end tests: a simulated GPU node and GPU containers on it."""

from __future__ import annotations

import os

import pytest

# Re-exported fixtures from the container support package.
from tests.support.fixtures import (  # noqa: F401 - fixtures
    busybox_image_tar,
    need_binaries,
    need_root,
    need_rootfs_tools,
    pause_image_tar,
    rootfs,
)

# The shared GPU-container helpers (tests.support.gpu_runs), re-exported for the e2e tests.
from tests.support.gpu_runs import NVCT, PATH_ENV, SHIM, VENV_BIN, node_config  # noqa: F401 - re-exported

HOOK = os.path.join(VENV_BIN, "nvidia-container-runtime-hook")


def expected_nodes(manifest, gpus=(), migs=(), control=True) -> set[str]:
    """The /dev paths a container gets for whole GPUs ``gpus`` and MIG devices ``(gpu, mig)``."""
    out = set()
    if control:
        out |= {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
    for g in gpus:
        out.add(f"/dev/nvidia{manifest['gpus'][g]['minor']}")
    for g, m in migs:
        gpu = manifest["gpus"][g]
        mig = gpu["mig_devices"][m]
        out |= {f"/dev/nvidia{gpu['minor']}", f"/dev/nvidia-caps/nvidia-cap{mig['gi_cap_minor']}",
                f"/dev/nvidia-caps/nvidia-cap{mig['ci_cap_minor']}"}
    return out


@pytest.fixture
def gpu_runtimes():
    need_root()
    need_rootfs_tools()
    need_binaries("/usr/sbin/runc", "/usr/bin/crun")
    from tests.support import cgroupfix

    cgroupfix.ensure_crun_works()
