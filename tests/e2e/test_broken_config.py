"""A broken config.toml through the shim and real runc: no GPU asked, the container runs; a GPU
container gets the error.

Where ``nvidia`` is the default runtime, one typo in config.toml must not stop every container on the node.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support.bundle import make_bundle
from tests.support.gpu_runs import PATH_ENV, SHIM, need_runtime, refusal, run_gpu
from tests.support.runtimes import run_container

pytestmark = pytest.mark.containers

BROKEN = '[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["runc"\n'  # an unclosed list


def _run(tmp_path, rootfs, env=(), mounts=()):
    config = tmp_path / "config.toml"
    config.write_text(BROKEN)
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", "echo inside"],
                         env=[PATH_ENV, *env], mounts=mounts)
    result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": str(config),
                                                "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                           log_file=os.path.join(str(tmp_path), "runc.log.json"))
    return config, result


def _warnings(result) -> list[str]:
    return [entry["msg"] for entry in map(json.loads, result.log.splitlines()) if entry["level"] == "warning"]


def test_a_container_that_asks_for_no_gpu_runs_with_the_default_runtime_and_a_warning(tmp_path, rootfs):
    need_runtime("runc")
    config, result = _run(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=void"])
    assert result.ok, result.describe()
    assert result.stdout.strip() == "inside"
    [warning] = {w for w in _warnings(result)}
    assert warning.startswith(f"nvidia-container-runtime: warning: {config}: invalid TOML: "
                              "Unclosed array (at end of document)")
    assert warning.endswith("; running /usr/sbin/runc without GPU support")


def test_a_gpu_container_gets_the_config_error(tmp_path, rootfs):
    need_runtime("runc")
    config, result = _run(tmp_path, rootfs, env=["NVIDIA_VISIBLE_DEVICES=all"])
    text = refusal(result)
    assert text == f"nvidia-container-runtime: {config}: invalid TOML: Unclosed array (at end of document)\n"
    assert "inside" not in result.stdout


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_a_typo_in_a_key_is_logged_once_per_start_and_the_gpu_container_runs(tmp_path, rootfs, sim_node, mode):
    need_runtime("runc")
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     extra_config='mod = "legacy"\n', command="ls /dev/nvidia0")
    assert result.ok, result.describe()
    assert result.stdout.strip() == "/dev/nvidia0"
    with open(os.path.join(str(tmp_path), "nvct.log")) as f:
        typos = [line for line in f if "unknown key" in line]
    config = os.path.join(str(tmp_path), "config.toml")
    [line] = typos
    assert (f"{config}: unknown key 'nvidia-container-runtime.mod' ignored "
            "(a typo? 'nvct config default' lists every key)") in line
    assert "warn" in line.lower()
