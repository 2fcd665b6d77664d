"""``nvidia-ctk runtime configure --runtime=docker|containerd``, the install guides' line, on real daemons.

The program is run as installed, with the guides' flags only (plus
``--config`` naming the private daemon's file). The runtime path it writes
is the reference's default: for docker ``nvidia-container-runtime`` by name,
which dockerd finds on its PATH; for containerd ``/usr/bin/...``, the deb's
path, so this pip install names its own with ``--nvidia-runtime-path``. Then a GPU container runs
on the ``nvidia`` runtime.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import tomlkit

from tests.e2e.conftest import VENV_BIN, expected_nodes, node_config
from tests.support.containerd import CONTAINERD, CTR, K8S_NAMESPACE, RUNC, Containerd
from tests.support.docker import DOCKER, DOCKERD, Dockerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_module, need_root

pytestmark = pytest.mark.containers

NVIDIA_CTK = os.path.join(VENV_BIN, "nvidia-ctk")
PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


def nvidia_ctk(*args: str) -> None:
    proc = subprocess.run([NVIDIA_CTK, *args], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert proc.returncode == 0, proc.stderr


def assert_gpu_zero(stdout: str, sim_node) -> None:
    assert {ln for ln in stdout.splitlines() if ln.startswith("/dev/")} == expected_nodes(sim_node, [0])
    assert "ok libcuda.so.1" in stdout
    assert f"(UUID: {sim_node['gpus'][0]['uuid']})" in stdout


class CtkDockerd(Dockerd):
    def _write_config(self, always_runtimes: bool = False) -> None:
        super()._write_config(always_runtimes)
        nvidia_ctk("runtime", "configure", "--runtime=docker", f"--config={self.config_file}")


class CtkContainerd(Containerd):
    def config(self):
        with open(self.config_file, "w") as f:
            f.write(tomlkit.dumps(super().config()))
        # containerd's default is /usr/bin/nvidia-container-runtime (the deb's path); this is a pip install
        nvidia_ctk("runtime", "configure", "--runtime=containerd", f"--config={self.config_file}",
                   f"--nvidia-runtime-path={VENV_BIN}/nvidia-container-runtime")
        with open(self.config_file) as f:
            return tomlkit.parse(f.read())


def test_docker(busybox_image_tar, sim_node, tmp_path):
    need_root("runs dockerd")
    need_binaries(DOCKERD, DOCKER, RUNC)
    config = node_config(tmp_path, sim_node, mode="legacy")
    with CtkDockerd(extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}, path_prefix=(VENV_BIN,)) as d:
        with open(d.config_file) as f:
            assert '"nvidia-container-runtime"' in f.read()
        d.load(busybox_image_tar)
        result = d.run(["--rm", "--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0", BUSYBOX_IMAGE_QUALIFIED,
                        "sh", "-c", PROBE])
    assert result.ok, result.describe()
    assert_gpu_zero(result.stdout, sim_node)


def test_containerd(busybox_image_tar, pause_image_tar, sim_node, tmp_path):
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    need_module("grpc", "python3-grpcio, the CRI client")
    config = node_config(tmp_path, sim_node, mode="legacy")
    with CtkContainerd(extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}, path_prefix=(VENV_BIN,)) as c:
        for tar in (busybox_image_tar, pause_image_tar):
            c.import_image(tar, K8S_NAMESPACE)
        result = c.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], runtime_handler="nvidia",
                           env={"NVIDIA_VISIBLE_DEVICES": "0"})
    assert result.rc == 0, result.describe()
    assert_gpu_zero(result.stdout, sim_node)
