"""``ctr run --gpus N`` on a real containerd 1.6: its hook runs nvct's nvidia-container-cli.

ctr looks ``nvidia-container-cli`` up on its PATH and adds the prestart hook
``containerd oci-hook -- <it> --load-kmods configure --device=N --compute
--compat32 --graphics --utility --video --display --pid={{pid}} {{rootfs}}``
with ctr's environment; no NVIDIA runtime is configured in containerd. The
container sees exactly GPU N, and libcuda loads.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import VENV_BIN, expected_nodes, node_config
from tests.support.containerd import CONTAINERD, CTR, RUNC, Containerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_root

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


@pytest.fixture(scope="module")
def gpus_containerd(busybox_image_tar, sim_node, tmp_path_factory):
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    tmp = tmp_path_factory.mktemp("ctr-gpus")
    bindir = tmp / "bin"  # only nvidia-container-cli: ctr must find nvct's, not another program
    bindir.mkdir()
    os.symlink(os.path.join(VENV_BIN, "nvidia-container-cli"), bindir / "nvidia-container-cli")
    config = node_config(tmp, sim_node, mode="legacy")
    with Containerd(path_prefix=[str(bindir)], extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}) as daemon:
        daemon.import_image(busybox_image_tar)
        yield daemon


@pytest.mark.parametrize("gpu", [0, 1])
def test_ctr_run_gpus_sees_exactly_that_gpu(gpus_containerd, sim_node, gpu):
    result = gpus_containerd.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], extra_args=["--gpus", str(gpu)])
    assert result.rc == 0, result.describe() + gpus_containerd.log_tail()
    nodes = {line for line in result.stdout.splitlines() if line.startswith("/dev/")}
    assert nodes == expected_nodes(sim_node, [gpu])
    assert "ok libcuda.so.1" in result.stdout
    uuid = sim_node["gpus"][gpu]["uuid"]
    smi = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert smi == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid})"], result.stdout


def test_ctr_run_without_gpus_gets_nothing(gpus_containerd):
    result = gpus_containerd.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", "ls /dev | grep -c nvidia; true"])
    assert result.rc == 0 and result.stdout.strip() == "0", result.describe()


def test_ctr_run_gpus_with_the_driver_root_given_on_the_command_line(busybox_image_tar, sim_node, tmp_path):
    """A driver container's root as ``--root`` (the config names none): configure's own flags once
    replaced the global ones, so the driver was looked for under / and the container did not start."""
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    root = sim_node["roots"]["driver_root"]
    config = node_config(tmp_path, sim_node, mode="legacy")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace(f'root = "{root}"\n', "", 1))  # [nvct] dev-root and proc-root stay
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvidia-container-cli"
    wrapper.write_text(f'#!/bin/sh\nexec {os.path.join(VENV_BIN, "nvidia-container-cli")} --root "{root}" "$@"\n')
    wrapper.chmod(0o755)
    with Containerd(path_prefix=[str(bindir)], extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}) as daemon:
        daemon.import_image(busybox_image_tar)
        result = daemon.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], extra_args=["--gpus", "1"])
        assert result.rc == 0, result.describe() + daemon.log_tail()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == expected_nodes(sim_node, [1])
    assert "ok libcuda.so.1" in result.stdout
