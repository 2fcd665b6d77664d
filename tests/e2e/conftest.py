"""Fixtures for end-to-end tests: a simulated GPU node and GPU containers on it."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.fixtures import need_binaries, need_root, need_rootfs_tools

# Re-exported fixtures from the container support package.
from tests.support.fixtures import busybox_image_tar, rootfs  # noqa: F401

VENV_BIN = os.path.dirname(sys.executable)
SHIM = os.path.join(VENV_BIN, "nvidia-container-runtime")
HOOK = os.path.join(VENV_BIN, "nvidia-container-runtime-hook")
NVCT = os.path.join(VENV_BIN, "nvct")
PATH_ENV = "PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"


def node_config(tmp_path, sim_node, *, mode: str, runtime: str = "runc", extra: str = "") -> str:
    """A config file: the node's three roots, plus the mode and low-level runtime."""
    with open(sim_node["config"]) as f:
        base = f.read()
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w") as f:
        f.write(base)
        f.write(f'\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runtime}"]\n')
        f.write(f'debug = "{tmp_path}/nvct.log"\n')
        f.write(extra)
    return path


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
