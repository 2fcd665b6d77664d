"""apply-cuda-memory-limits: registered under both hook programs, its inputs checked before NVML.

The NVML call itself, seen by the simulated node's NVML under cgroup v2
through runc, is in tests/e2e/test_memory_limits.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvct.base.errors import NvctError
from nvct.hooks import limits, steps
from nvct.hooks.container import HookContext

BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("argv", [["nvidia-cdi-hook", "--help"], ["nvidia-ctk", "hook", "--help"],
                                  ["nvct", "hook", "--help"]])
def test_the_hook_is_listed(argv):
    proc = subprocess.run([os.path.join(BIN, argv[0]), *argv[1:]], capture_output=True, text=True)
    assert proc.returncode == 0 and "apply-cuda-memory-limits" in proc.stdout, proc


def _run(env, *argv, pid=None):
    ctx = HookContext(rootfs="/nonexistent", spec={"process": {"env": env}}, pid=pid)
    steps.run_chain(["apply-cuda-memory-limits", *argv], ctx)


def test_without_variables_nothing_is_asked(monkeypatch):
    monkeypatch.setattr(limits, "_set_memory_limits", lambda *a: pytest.fail("NVML called"))
    _run(["PATH=/bin"], "--gpu-id", "GPU-x")  # no pid needed either


def test_only_one_variable_warns(monkeypatch, capsys):
    monkeypatch.setattr(limits, "_set_memory_limits", lambda *a: pytest.fail("NVML called"))
    _run(["NVIDIA_GPU_MEMORY_LIMIT=10"], "--gpu-id", "GPU-x")
    assert "NVIDIA_GPU_MEMORY_REQUEST is not set" in capsys.readouterr().err


@pytest.mark.parametrize("env, argv, message", [
    (["NVIDIA_GPU_MEMORY_REQUEST=-1", "NVIDIA_GPU_MEMORY_LIMIT=10"], ("--gpu-id", "G"), "not a whole number"),
    (["NVIDIA_GPU_MEMORY_REQUEST=10", "NVIDIA_GPU_MEMORY_LIMIT=1e3"], ("--gpu-id", "G"), "not a whole number"),
    (["NVIDIA_GPU_MEMORY_REQUEST=20", "NVIDIA_GPU_MEMORY_LIMIT=10"], ("--gpu-id", "G"), "exceeds the limit"),
    (["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=1"], ("--gpu-id", " "), "must not be empty"),
    (["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=1"], ("--gpu-id", "G"), "names no pid"),
])
def test_bad_input_is_one_error(env, argv, message):
    with pytest.raises(NvctError, match=message):
        _run(env, *argv)


def test_the_plural_names_win_and_values_are_bytes(monkeypatch):
    calls = []
    monkeypatch.setattr(limits, "_set_memory_limits", lambda *a: calls.append(a))
    monkeypatch.setattr("nvct.linux.cgroups.cgroup_version", lambda pid: 2)
    monkeypatch.setattr("nvct.linux.cgroups.unified_cgroup_dir", lambda pid: f"/sys/fs/cgroup/c{pid}")
    _run(["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_REQUESTS=2", "NVIDIA_GPU_MEMORY_LIMIT=3",
          "NVIDIA_GPU_MEMORY_LIMITS=4"], "--driver-root", "/drv", "--gpu-id", "GPU-a", "--gpu-id", "GPU-b", pid=7)
    assert calls == [("/drv", ["GPU-a", "GPU-b"], "/sys/fs/cgroup/c7", 2 << 20, 4 << 20)]


def test_cgroup_v1_is_refused(monkeypatch):
    monkeypatch.setattr("nvct.linux.cgroups.cgroup_version", lambda pid: 1)
    with pytest.raises(NvctError, match="need cgroup v2"):
        _run(["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=1"], "--gpu-id", "G", pid=7)


@pytest.fixture(scope="module")
def jit(sim_node):
    from nvct.config import file as config_mod
    from nvct.discover.driver import Driver

    config = config_mod.load(sim_node["config"])
    return config, Driver.from_config(config)


def _jit_hooks(jit, env, hook_path="/usr/bin/nvct", disabled=()):
    from nvct.cdi.features import Generation
    from nvct.edits import build as injection
    from nvct.request import container as request_mod

    config, driver = jit
    req = request_mod.from_env(env, config)
    edits = injection.container_edits(req, driver, config, hook_path=hook_path,
                                      generation=Generation(disabled_hooks=disabled))
    return [h for h in edits.hooks if h.hook_name == "createRuntime"]


MEMORY = {"NVIDIA_GPU_MEMORY_REQUEST": "1", "NVIDIA_GPU_MEMORY_LIMITS": "2"}


@pytest.mark.parametrize("hook_path, argv0", [("/usr/bin/nvct", ["nvct", "hook"]),
                                              ("/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook"]),
                                              ("/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook"])])
def test_jit_cdi_hook_for_the_whole_gpus(jit, sim_node, hook_path, argv0):
    [hook] = _jit_hooks(jit, {"NVIDIA_VISIBLE_DEVICES": "1,0:0", **MEMORY}, hook_path)
    root = sim_node["roots"]["driver_root"]
    assert hook.path == hook_path
    assert list(hook.args) == [*argv0, "apply-cuda-memory-limits", "--driver-root", root,
                               "--gpu-id", sim_node["gpus"][1]["uuid"]]  # the MIG device gets none


@pytest.mark.parametrize("env, disabled", [
    ({"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_GPU_MEMORY_LIMIT": "2"}, ()),  # no request: nothing to set
    ({"NVIDIA_VISIBLE_DEVICES": "0:0", **MEMORY}, ()),                      # MIG only: NVML refuses MIG
    ({"NVIDIA_VISIBLE_DEVICES": "1", **MEMORY}, ("apply-cuda-memory-limits",)),
    ({"NVIDIA_VISIBLE_DEVICES": "1", **MEMORY}, ("all",)),
])
def test_jit_cdi_no_hook(jit, env, disabled):
    assert _jit_hooks(jit, env, disabled=disabled) == []
