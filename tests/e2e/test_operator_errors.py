"""The errors an operator hits most, through the shim and real runc: one line each that says what to do.

Each message is asserted word for word, as the user reads it from the engine
(the shim's stderr), and where ``nvct explain`` shows it, from the real CLI.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.bundle import make_bundle
from tests.support.gpu_runs import NVCT, PATH_ENV, SHIM, need_runtime, node_config, refusal
from tests.support.runtimes import run_container

pytestmark = pytest.mark.containers

DEVICE_LIST = "/var/run/nvidia-container-devices"


def _config(tmp_path, node, **roots) -> str:
    """The node's config (auto mode, runc) with ``root``/``proc-root`` replaced."""
    path = node_config(tmp_path, node, mode="auto")
    with open(path) as f:
        text = f.read()
    for key, value in roots.items():
        key = key.replace("_", "-")
        old = [line for line in text.splitlines() if line.startswith(f"{key} = ")][0]
        text = text.replace(old + "\n", f'{key} = "{value}"\n', 1)
    with open(path, "w") as f:
        f.write(text)
    return path


def _start(tmp_path, rootfs, config, env, mounts=()):
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", "echo inside"],
                         env=[PATH_ENV, *env], mounts=mounts)
    result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                                "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                           log_file=os.path.join(str(tmp_path), "runc.log.json"))
    assert "inside" not in result.stdout
    return refusal(result)


def _explain_error(config, *env) -> str:
    args = [NVCT, "--config", config, "explain"] + [a for e in env for a in ("-e", e)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    return line


def _without_module(tmp_path, node) -> str:
    proc = os.path.join(str(tmp_path), "proc")
    shutil.copytree(node["roots"]["proc_root"], proc, symlinks=True)
    shutil.rmtree(os.path.join(proc, "driver/nvidia"))
    return proc


def test_a_gpu_by_index_without_the_kernel_module_says_the_driver_is_not_loaded(tmp_path, rootfs, sim_node):
    need_runtime("runc")
    proc = _without_module(tmp_path, sim_node)
    config = _config(tmp_path, sim_node, proc_root=proc)
    said = (f"{proc}/driver/nvidia/version: not found: the NVIDIA driver is not loaded "
            f"(load its kernel module: modprobe nvidia)")
    for value in ("1", "all"):
        assert _start(tmp_path, rootfs, config, [f"NVIDIA_VISIBLE_DEVICES={value}"]) == \
            f"nvidia-container-runtime: {said}\n"
        assert _explain_error(config, f"NVIDIA_VISIBLE_DEVICES={value}") == \
            f"error:    the container would not start: {said}"
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace('mode = "auto"', 'mode = "legacy"'))
    # legacy mode: the shim resolves the devices for the spec's device rules, so it says it first
    assert _start(tmp_path, rootfs, config, ["NVIDIA_VISIBLE_DEVICES=1"]) == f"nvidia-container-runtime: {said}\n"
    with open(config, "w") as f:  # without cgroup rules the shim leaves the devices to the hook
        f.write(text.replace('mode = "auto"', 'mode = "legacy"').replace(
            "[nvidia-container-cli]\n", "[nvidia-container-cli]\nno-cgroups = true\n", 1))
    # the prestart hook says it, and runc passes its stderr on
    assert _start(tmp_path, rootfs, config, ["NVIDIA_VISIBLE_DEVICES=1"]).endswith(
        f"stderr: nvidia-container-runtime-hook: {said}\n\n")


def test_a_missing_driver_root_names_the_key_and_its_value(tmp_path, rootfs, sim_node):
    need_runtime("runc")
    missing = os.path.join(str(tmp_path), "run/nvidia/driver")
    config = _config(tmp_path, sim_node, root=missing)
    assert _start(tmp_path, rootfs, config, ["NVIDIA_VISIBLE_DEVICES=0"]) == (
        f"nvidia-container-runtime: nvidia-container-cli.root: the driver root {missing} does not exist; "
        f"set it to the directory the driver is installed in\n")


def test_an_unknown_device_points_to_nvct_info_which_lists_indices_and_uuids(tmp_path, rootfs, sim_node):
    need_runtime("runc")
    config = _config(tmp_path, sim_node)
    assert _start(tmp_path, rootfs, config, ["NVIDIA_VISIBLE_DEVICES=9"]) == (
        "nvidia-container-runtime: NVIDIA_VISIBLE_DEVICES: unknown device '9' (this node has GPUs 0-7 and "
        "2 MIG device(s); 'nvct info' lists their indices and UUIDs)\n")
    info = subprocess.run([NVCT, "--config", config, "info"], capture_output=True, text=True, timeout=60).stdout
    assert "Device Index:   7" in info and f"GPU UUID:       {sim_node['gpus'][7]['uuid']}" in info


def test_a_device_list_as_volume_mounts_under_the_default_config_names_the_setting(tmp_path, rootfs, sim_node):
    need_runtime("runc")
    config = _config(tmp_path, sim_node)
    mount = {"destination": f"{DEVICE_LIST}/0", "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]}
    assert _start(tmp_path, rootfs, config, [f"NVIDIA_VISIBLE_DEVICES={DEVICE_LIST}"], mounts=[mount]) == (
        f"nvidia-container-runtime: NVIDIA_VISIBLE_DEVICES={DEVICE_LIST} means the GPUs are listed as volume "
        "mounts, which this config ignores: set accept-nvidia-visible-devices-as-volume-mounts = true\n")
