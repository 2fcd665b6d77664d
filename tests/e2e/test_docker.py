"""GPU containers through docker 20.10: ``--runtime=nvidia`` (the shim) and ``--gpus`` (the hook).

dockerd is private (own data root, exec root, pidfile, socket, no bridge) and
finds ``nvidia-container-runtime-hook`` on its PATH at start, as ``--gpus`` needs.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import SHIM, VENV_BIN, expected_nodes, node_config
from tests.support.fixtures import BUSYBOX_IMAGE, need_binaries, need_root
from tests.support.legacy_front import entry, gpu_front

pytestmark = pytest.mark.containers

LIST_AND_PROBE = ("find /dev -type c -name 'nvidia*' | sort; "
                  "dlopen-probe libcuda.so.1 libnvidia-ml.so.1 && nvidia-smi -L")


@pytest.fixture(scope="module")
def gpu_dockerd(tmp_path_factory, sim_node, busybox_image_tar):
    need_root("runs dockerd")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker", "/usr/sbin/runc")
    from tests.support.docker import Dockerd

    config = node_config(tmp_path_factory.mktemp("docker-config"), sim_node, mode="jit-cdi")
    legacy = _legacy_front(tmp_path_factory.mktemp("docker-legacy"), sim_node)
    with Dockerd(runtimes={"nvidia": SHIM, "nvidia-legacy": legacy.entry},
                 extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}, path_prefix=(VENV_BIN,)) as dockerd:
        dockerd.load(busybox_image_tar)
        dockerd.legacy = legacy
        yield dockerd


def _legacy_front(directory, sim_node):
    """A legacy-mode shim (a copy of the front with a witness of Python starts, see
    tests.support.legacy_front) under a recorded config of its own, which ``entry`` sets."""
    front, config = gpu_front(directory, sim_node["config"], "/usr/sbin/runc")
    front.entry = entry(front, config)
    return front


def _nodes(stdout: str) -> set[str]:
    return {line for line in stdout.splitlines() if line.startswith("/dev/")}


def _smi(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("GPU ")]


def test_runtime_nvidia_with_visible_devices(gpu_dockerd, sim_node):
    result = gpu_dockerd.run(["--rm", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1,3",
                              BUSYBOX_IMAGE, "sh", "-c", LIST_AND_PROBE])
    assert result.rc == 0, result.describe()
    assert _nodes(result.stdout) == expected_nodes(sim_node, [1, 3])
    assert "ok libcuda.so.1" in result.stdout
    assert _smi(result.stdout) == [f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][i]['uuid']})"
                                   for n, i in enumerate((1, 3))]


def test_legacy_mode_without_a_python_start_in_the_shim(gpu_dockerd, sim_node):
    """docker's spec (one line, its libnetwork-setkey prestart hook) under a recorded legacy config:
    the sh front appends the hook; Python starts only in the hook."""
    result = gpu_dockerd.run(["--rm", "--runtime=nvidia-legacy", "-e", "NVIDIA_VISIBLE_DEVICES=1,3",
                              BUSYBOX_IMAGE, "sh", "-c", LIST_AND_PROBE])
    assert result.rc == 0, result.describe()
    assert _nodes(result.stdout) == expected_nodes(sim_node, [1, 3])
    assert len(_smi(result.stdout)) == 2 and "ok libcuda.so.1" in result.stdout
    assert gpu_dockerd.legacy.starts() == {"shim": 1, "hook": 1}  # the shim's one: recording the config


def test_runtime_nvidia_without_gpu_request_passes_through(gpu_dockerd):
    result = gpu_dockerd.run(["--rm", "--runtime=nvidia", BUSYBOX_IMAGE, "sh", "-c",
                              "find /dev -name 'nvidia*'; echo done"])
    assert result.rc == 0, result.describe()
    assert result.stdout.split() == ["done"]


def test_gpus_all_uses_the_hook(gpu_dockerd, sim_node):
    result = gpu_dockerd.run(["--rm", "--gpus", "all", BUSYBOX_IMAGE, "sh", "-c", LIST_AND_PROBE])
    assert result.rc == 0, result.describe()
    all_migs = [(0, 0), (0, 1)]
    assert _nodes(result.stdout) == expected_nodes(sim_node, range(len(sim_node["gpus"])), all_migs)
    assert len(_smi(result.stdout)) == len(sim_node["gpus"])


def test_gpus_device_list(gpu_dockerd, sim_node):
    result = gpu_dockerd.run(["--rm", "--gpus", '"device=2,5"', BUSYBOX_IMAGE, "sh", "-c", LIST_AND_PROBE])
    assert result.rc == 0, result.describe()
    assert _nodes(result.stdout) == expected_nodes(sim_node, [2, 5])


def test_docker_shows_the_shims_error_line(gpu_dockerd):
    result = gpu_dockerd.run(["--rm", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=42",
                              BUSYBOX_IMAGE, "true"])
    assert result.rc != 0
    assert "NVIDIA_VISIBLE_DEVICES: unknown device '42'" in result.stderr


def test_unsatisfied_requirement_under_gpus(gpu_dockerd):
    result = gpu_dockerd.run(["--rm", "--gpus", "all", "-e", "NVIDIA_REQUIRE_CUDA=cuda>=99.0",
                              BUSYBOX_IMAGE, "true"])
    assert result.rc != 0
    assert "unsatisfied condition: cuda>=99.0" in result.stderr
