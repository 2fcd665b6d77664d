"""apply-cuda-memory-limits: the container's GPU memory request and limit reach NVML for its cgroup.

runc runs in cgroup v2 mode (tests/e2e/test_cgroup_v2.py's bed:
cgroup2 on /sys/fs/cgroup in a private mount namespace per call), with the
hook as NVIDIA's generated specs place it: a createRuntime hook
``nvidia-cdi-hook apply-cuda-memory-limits --driver-root R --gpu-id UUID``.
The simulated node's NVML records each ``nvmlDeviceSetMemoryLimits_v1`` call
in <root>/var/nvml-memory-limits.log; the container prints its own cgroup,
which must be the namespace NVML was given.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.test_cgroup_v2 import _run, v2_runc  # noqa: F401 - the fixture
from tests.support.bundle import make_bundle
from tests.support.gpu_runs import PATH_ENV, VENV_BIN

pytestmark = pytest.mark.containers

#: The two programs NVIDIA's specs name for it: nvidia-cdi-hook, and nvidia-ctk hook (the runtime's own specs).
PROGRAMS = {"nvidia-cdi-hook": (os.path.join(VENV_BIN, "nvidia-cdi-hook"), ["nvidia-cdi-hook"]),
            "nvidia-ctk": (os.path.join(VENV_BIN, "nvidia-ctk"), ["nvidia-ctk", "hook"])}


def _bundle(tmp_path, sim_node, rootfs, env, gpus, program="nvidia-cdi-hook"):
    root = sim_node["roots"]["driver_root"]
    path, argv0 = PROGRAMS[program]
    hook = {"path": path, "args": [*argv0, "apply-cuda-memory-limits", "--driver-root", root,
                                       *[a for g in gpus for a in ("--gpu-id", g)]],
            "env": [PATH_ENV]}
    return make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["cat", "/proc/self/cgroup"],
                       env=[PATH_ENV, *env], hooks={"createRuntime": [hook]})


def _log(sim_node) -> str:
    path = os.path.join(sim_node["roots"]["driver_root"], "var/nvml-memory-limits.log")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


@pytest.fixture
def limits_log(sim_node):
    """The mock's log, emptied before and after (the node is shared by the session)."""
    path = os.path.join(sim_node["roots"]["driver_root"], "var/nvml-memory-limits.log")
    if os.path.exists(path):
        os.unlink(path)
    yield path
    if os.path.exists(path):
        os.unlink(path)


@pytest.mark.parametrize("program", sorted(PROGRAMS))
@pytest.mark.parametrize("names", [("NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_LIMIT"),
                                   ("NVIDIA_GPU_MEMORY_REQUESTS", "NVIDIA_GPU_MEMORY_LIMITS")])
def test_nvml_gets_the_containers_cgroup_and_limits(tmp_path, sim_node, rootfs, v2_runc, limits_log,
                                                    names, program):
    gpus = [sim_node["gpus"][1]["uuid"], sim_node["gpus"][3]["uuid"]]
    bundle = _bundle(tmp_path, sim_node, rootfs, [f"{names[0]}=1024", f"{names[1]}=4096"], gpus, program)
    _, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc == 0, result.describe()
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("0::")]
    cgroup = "/sys/fs/cgroup" + line[3:].rstrip("/")
    assert _log(sim_node).splitlines() == [f"{g} {cgroup} {1024 << 20} {4096 << 20}" for g in gpus]


def test_without_both_variables_nothing_is_set(tmp_path, sim_node, rootfs, v2_runc, limits_log):
    bundle = _bundle(tmp_path, sim_node, rootfs, ["NVIDIA_GPU_MEMORY_LIMIT=4096"], [sim_node["gpus"][0]["uuid"]])
    _, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc == 0, result.describe()  # a warning only (runc shows no stderr of a hook that succeeds)
    assert _log(sim_node) == ""


@pytest.mark.parametrize("env, message", [
    (["NVIDIA_GPU_MEMORY_REQUEST=8192", "NVIDIA_GPU_MEMORY_LIMIT=4096"], "request (8192 MiB) exceeds the limit"),
    (["NVIDIA_GPU_MEMORY_REQUEST=1Gi", "NVIDIA_GPU_MEMORY_LIMIT=4096"], "is not a whole number of MiB"),
])
def test_bad_values_stop_the_start_with_one_line(tmp_path, sim_node, rootfs, v2_runc, limits_log, env, message):
    bundle = _bundle(tmp_path, sim_node, rootfs, env, [sim_node["gpus"][0]["uuid"]])
    _, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc != 0
    assert message in result.stderr and "Traceback" not in result.stderr, result.describe()
    assert _log(sim_node) == ""


def test_a_driver_without_the_call_is_one_line(tmp_path, sim_node, rootfs, v2_runc):
    """An NVML that lacks nvmlDeviceSetMemoryLimits_v1 (drivers before it) stops the start, saying so."""
    root = tmp_path / "old-driver"
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    src = tmp_path / "old_nvml.c"
    src.write_text("int nvmlInit_v2(void) { return 0; }\nint nvmlShutdown(void) { return 0; }\n"
                   "int nvmlDeviceGetHandleByUUID(const char *u, void **h) { (void)u; *h = (void *)1; return 0; }\n"
                   "const char *nvmlErrorString(int r) { (void)r; return \"error\"; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    bundle = _bundle(tmp_path, {"roots": {"driver_root": str(root)}}, rootfs,
                     ["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=2"], [sim_node["gpus"][0]["uuid"]])
    _, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc != 0
    assert "has no nvmlDeviceSetMemoryLimits_v1" in result.stderr and "Traceback" not in result.stderr


def test_jit_cdi_adds_the_hook_when_the_container_asks(tmp_path, sim_node, rootfs, v2_runc, limits_log):
    """The shim in jit-cdi mode: the hook for the container's whole GPUs, only with both variables set."""
    from tests.support.gpu_runs import run_gpu

    wrapper = v2_runc[:-1]  # the shim, and the runc it starts, in the cgroup v2 namespace
    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", wrapper=wrapper, command="cat /proc/self/cgroup",
                     env=["NVIDIA_VISIBLE_DEVICES=2,3", "NVIDIA_GPU_MEMORY_REQUEST=512",
                          "NVIDIA_GPU_MEMORY_LIMIT=2048"])
    assert result.rc == 0, result.describe()
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("0::")]
    cgroup = "/sys/fs/cgroup" + line[3:].rstrip("/")
    gpus = [sim_node["gpus"][i]["uuid"] for i in (2, 3)]
    assert _log(sim_node).splitlines() == [f"{g} {cgroup} {512 << 20} {2048 << 20}" for g in gpus]
    os.unlink(limits_log)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", wrapper=wrapper, name="plain",
                     env=["NVIDIA_VISIBLE_DEVICES=2", "NVIDIA_GPU_MEMORY_LIMIT=2048"])
    assert result.rc == 0, result.describe()
    assert _log(sim_node) == ""
    with open(os.path.join(str(tmp_path), "plain", "config.json")) as f:
        assert "apply-cuda-memory-limits" not in f.read()


def test_a_generated_spec_gives_each_gpu_the_hook(tmp_path, sim_node, rootfs, v2_runc, limits_log):
    """``nvct cdi generate`` adds the hook to each whole GPU's device, as the reference's specs do: a
    container given two GPUs by CDI names (the shim's cdi mode applying the spec, under runc) gets
    both GPUs' limits; one without the variables runs the hooks, which set nothing."""
    from tests.support.gpu_runs import run_gpu

    wrapper = v2_runc[:-1]
    result = run_gpu(tmp_path, sim_node, rootfs, mode="cdi", wrapper=wrapper, command="cat /proc/self/cgroup",
                     env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=2,nvidia.com/gpu=3",
                          "NVIDIA_GPU_MEMORY_REQUEST=512", "NVIDIA_GPU_MEMORY_LIMIT=2048"])
    assert result.rc == 0, result.describe()
    [line] = [ln for ln in result.stdout.splitlines() if ln.startswith("0::")]
    cgroup = "/sys/fs/cgroup" + line[3:].rstrip("/")
    gpus = [sim_node["gpus"][i]["uuid"] for i in (2, 3)]
    assert sorted(_log(sim_node).splitlines()) == sorted(f"{g} {cgroup} {512 << 20} {2048 << 20}" for g in gpus)
    os.unlink(limits_log)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="cdi", wrapper=wrapper, name="plain",
                     env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=2"])
    assert result.rc == 0, result.describe()
    assert _log(sim_node) == ""
    with open(os.path.join(str(tmp_path), "plain", "config.json")) as f:
        hooks = json.load(f)["hooks"]["createRuntime"]
    assert [h["args"][h["args"].index("apply-cuda-memory-limits"):] for h in hooks] == [
        ["apply-cuda-memory-limits", "--driver-root", sim_node["roots"]["driver_root"], "--gpu-id", gpus[0]]]
