"""Legacy mode with the hook appended by the shim's sh front (no Python start), under runc and crun.

The spec is docker's shape (one line, a prestart hook of its own already there, ``--log-format
json``) and the config is old enough to be recorded, as on a node: the shim's Python runs once
to record it, then never on a create, and the hook it would have inserted does the work.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import PATH_ENV, expected_nodes
from tests.support.bundle import make_bundle
from tests.support.containerd import K8S_NAMESPACE, Containerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_module
from tests.support.gpu_runs import need_runtime
from tests.support.legacy_front import entry, gpu_front, run
from tests.support.runtimes import RUNTIMES

pytestmark = pytest.mark.containers

COMMAND = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


def _run(tmp_path, sim_node, rootfs, runtime, visible):
    need_runtime(runtime)
    front, config = gpu_front(tmp_path, sim_node["config"], RUNTIMES[runtime][0])
    marker = tmp_path / "engine-hook-ran"
    engine_hook = {"path": "/bin/sh", "args": ["sh", "-c", f"cat >/dev/null; touch {marker}"], "env": ["PATH=/bin"]}
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", COMMAND],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={visible}"], hooks={"prestart": [engine_hook]})
    result = run(front, config, bundle, log_file=str(tmp_path / "runc.log"))
    assert marker.exists(), result.describe()  # the engine's own hook still runs
    return result, front.starts()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_the_gpus_arrive_through_the_hook_the_front_appended(tmp_path, sim_node, rootfs, runtime):
    result, starts = _run(tmp_path, sim_node, rootfs, runtime, "1,3")
    assert result.ok, result.describe()
    assert starts == {"shim": 1, "hook": 1}  # the shim's one start recorded the config
    lines = result.stdout.splitlines()
    assert {line for line in lines if line.startswith("/dev/")} == expected_nodes(sim_node, [1, 3])
    assert any(line.startswith("ok libcuda.so.1 ") for line in lines), result.stdout
    assert [line for line in lines if line.startswith("GPU ")] == [
        f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][i]['uuid']})" for n, i in enumerate((1, 3))]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_void_request_gets_a_hook_that_does_nothing(tmp_path, sim_node, rootfs, runtime):
    result, starts = _run(tmp_path, sim_node, rootfs, runtime, "void")
    assert result.rc == 1 and "nvidia" not in result.stdout, result.describe()  # dlopen-probe fails
    assert "libcuda.so.1" in result.stdout + result.stderr
    assert starts == {"shim": 1, "hook": 1}


def test_the_hooks_refusal_is_runcs_error_line(tmp_path, sim_node, rootfs):
    result, starts = _run(tmp_path, sim_node, rootfs, "runc", "99")
    assert not result.ok and starts == {"shim": 1, "hook": 1}
    [line] = [line for line in result.stderr.splitlines() if "nvidia-container-runtime-hook:" in line]
    assert "99" in line.split("nvidia-container-runtime-hook:")[1] and "Traceback" not in result.stderr


def test_a_kubernetes_pod_through_containerds_cri(tmp_path, sim_node, busybox_image_tar, pause_image_tar):
    """containerd 1.6's CRI spec (one line, the pod's annotations, no hooks) under a recorded legacy
    config: the pod sandbox passes through, the container gets the hook from the sh front."""
    need_module("grpc", "python3-grpcio, the CRI client")
    need_runtime("runc")
    need_binaries("/usr/bin/containerd")
    front, config = gpu_front(tmp_path, sim_node["config"], RUNTIMES["runc"][0])
    with Containerd(runtimes={"nvidia-legacy": entry(front, config)}) as containerd:
        for tar in (busybox_image_tar, pause_image_tar):
            containerd.import_image(tar, K8S_NAMESPACE)
        result = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", COMMAND], runtime_handler="nvidia-legacy",
                                    env={"NVIDIA_VISIBLE_DEVICES": "1,3"}, annotations={"example.com/a": "{[x]}"})
    assert result.rc == 0, result.describe()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == expected_nodes(sim_node, [1, 3])
    assert "ok libcuda.so.1" in result.stdout
    assert front.starts() == {"shim": 1, "hook": 1}
