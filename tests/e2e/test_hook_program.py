"""``nvidia-ctk.path``: the reference's key for the program jit-cdi and CDI hooks run, through the shim and runc.

The program is a logging wrapper named as NVIDIA's programs are, in front of
nvct's own; the container proves the hook chain ran (libcuda by soname, the
dev symlink), the log proves which program ran it. The images here have no ld
cache, so the chain stays a hook (only ldconfig can make one; otherwise the
shim does the chain's work itself, nvct.modifier.prepare).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.gpu_runs import NVCT, VENV_BIN, need_runtime, node_config, run_gpu

pytestmark = pytest.mark.containers


def _logging_program(tmp_path, name: str) -> tuple[str, str]:
    directory = os.path.join(str(tmp_path), "toolkit")
    os.makedirs(directory, exist_ok=True)
    path, log = os.path.join(directory, name), os.path.join(str(tmp_path), f"{name}.calls")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {log}\nexec {VENV_BIN}/{name} "$@"\n')
    os.chmod(path, 0o755)
    return path, log


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
@pytest.mark.parametrize("program", ["nvidia-ctk", "nvidia-cdi-hook"])
def test_the_hooks_run_the_program_nvidia_ctk_path_names(tmp_path, sim_node, rootfs, mode, program):
    need_runtime("runc")
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))
    path, log = _logging_program(tmp_path, program)
    extra = f'[nvidia-ctk]\npath = "{path}"\n'
    if mode == "cdi":  # a spec written by `nvct cdi generate` under this config
        specs = os.path.join(str(tmp_path), "specs")
        extra += f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{specs}"]\n'
        config = node_config(tmp_path, sim_node, mode=mode, extra=extra)
        subprocess.run([NVCT, "--config", config, "cdi", "generate", "--output", f"{specs}/nvidia.yaml"],
                       check=True, capture_output=True, timeout=120)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     extra_config=extra,
                     command="dlopen-probe libcuda.so.1 && readlink /usr/lib/x86_64-linux-gnu/libcuda.so")
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/")
    assert lines[1] == "libcuda.so.1"
    with open(log) as f:
        calls = f.read().splitlines()
    # A generated spec also gives each GPU its createRuntime memory-limits hook (docs/cdi.md).
    limits = [c for c in calls if "apply-cuda-memory-limits" in c]
    assert len(limits) == (1 if mode == "cdi" else 0), calls
    [call] = [c for c in calls if c not in limits]
    head = "hook chain " if program == "nvidia-ctk" else "chain "
    # A generated spec's chain checks NVIDIA_REQUIRE_* first (docs/cdi.md).
    assert call.startswith(head + ("--container-root " if mode == "jit-cdi" else "check-requirements "))


def test_nvct_path_wins_over_nvidia_ctk_path(tmp_path, sim_node, rootfs):
    need_runtime("runc")
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))
    ctk, ctk_log = _logging_program(tmp_path, "nvidia-ctk")
    nvct, nvct_log = _logging_program(tmp_path, "nvct")
    node = dict(sim_node, config=os.path.join(str(tmp_path), "node-config.toml"))
    with open(sim_node["config"]) as f:  # nvct.path goes into the node config's own [nvct] table
        text = f.read()
    with open(node["config"], "w") as f:
        f.write(text.replace("[nvct]\n", f'[nvct]\npath = "{nvct}"\n', 1))
    result = run_gpu(tmp_path, node, rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=0"],
                     extra_config=f'[nvidia-ctk]\npath = "{ctk}"\n', command="dlopen-probe libcuda.so.1")
    assert result.rc == 0, result.describe()
    assert os.path.exists(nvct_log) and not os.path.exists(ctk_log)
