"""Many GPU containers started at once through the shim, as a node's engine does after a reboot.

Sixteen create -> start -> delete lifecycles run concurrently under one config,
each in its own bundle and root and asking for one GPU: every one must
succeed and see exactly its GPU (its device node, and nvidia-smi names its
UUID), whatever the others are doing to /run/nvct's records at the same time.
How long the batch takes is tests/perf/bench.py's business, not this test's.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import PATH_ENV, SHIM, expected_nodes, node_config
from tests.support.bundle import make_bundle
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import RUNTIMES, _subreaper, create_start_delete

pytestmark = pytest.mark.containers

CONCURRENT = 16
COMMAND = "find /dev -type c -name 'nvidia*' | sort; nvidia-smi -L"


@pytest.mark.parametrize(("runtime", "mode"), [("runc", "jit-cdi"), ("crun", "jit-cdi"), ("runc", "legacy"),
                                               ("runc", "cdi")])
def test_concurrent_gpu_lifecycles_all_succeed_each_with_its_gpu(tmp_path, sim_node, gpu_runtimes, runtime, mode):
    config = node_config(tmp_path, sim_node, mode=mode, runtime=RUNTIMES[runtime][0])
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    gpus = [1 + i % 7 for i in range(CONCURRENT)]  # GPU 0 has MIG on: whole GPUs only here
    bundles = []
    for i, gpu in enumerate(gpus):
        rootfs = make_rootfs(tmp_path, name=f"rootfs-{i}")
        bundles.append(make_bundle(tmp_path / f"bundle-{i}", rootfs, ["sh", "-c", COMMAND],
                                   env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={sim_node['gpus'][gpu]['uuid']}"]))
    barrier = threading.Barrier(CONCURRENT)

    def lifecycle(bundle):
        barrier.wait(timeout=60)
        return create_start_delete([SHIM], bundle, env=env, timeout=120)

    # One subreaper for the batch: each lifecycle's own would be undone by the first to finish.
    with _subreaper(), ThreadPoolExecutor(CONCURRENT) as pool:
        results = list(pool.map(lifecycle, bundles))
    for gpu, result in zip(gpus, results):
        assert result.rc == 0, result.describe()
        nodes = {line for line in result.stdout.splitlines() if line.startswith("/dev/")}
        assert nodes == expected_nodes(sim_node, [gpu]), result.describe()
        smi = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
        assert smi == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][gpu]['uuid']})"], result.describe()
