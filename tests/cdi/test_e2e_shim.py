"""nvct's shim in cdi mode runs containers under runc and crun, devices from a spec dir.

The config is the simulated node's with ``mode = "cdi"``, the spec
directories pointing at a private directory holding the spec
``nvct cdi generate`` wrote, and the low-level runtime under test.
"""

from __future__ import annotations

import os

import pytest

from tests.support.bundle import make_bundle
from tests.support.runtimes import run_container

from . import e2e


def _shim_config(tmp_path, node, spec_dir, runtime: str) -> str:
    with open(node["config"]) as f:
        text = f.read()
    path = tmp_path / "config.toml"
    path.write_text(text + (
        "\n[nvidia-container-runtime]\n"
        'mode = "cdi"\n'
        f'runtimes = ["{runtime}"]\n'
        "\n[nvidia-container-runtime.modes.cdi]\n"
        f'spec-dirs = ["{spec_dir}"]\n'))
    return str(path)


@pytest.fixture
def shim(tmp_path, node, entry_points, oci_runtime):
    """(argv of the shim, its environment) with the node's spec in a private spec dir."""
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(e2e.generate_spec_text(entry_points, node))
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=_shim_config(tmp_path, node, spec_dir, oci_runtime[0]))
    return [entry_points["nvidia-container-runtime"]], env


@pytest.mark.parametrize("request_env, device", [
    ("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "0"),
    ("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all", "all"),
    ("NVIDIA_VISIBLE_DEVICES=0:0", "0:0"),  # unqualified: the default kind
])
def test_shim_in_cdi_mode_injects_the_device(shim, rootfs, tmp_path, node, request_env, device):
    argv, env = shim
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", e2e.CHECK_SCRIPT], [request_env])
    result = run_container(argv, bundle, env=env, log_file=str(tmp_path / "log.json"), timeout=60)
    e2e.assert_container_sees(result, node, device)


def test_shim_reports_an_undefined_device_in_the_runtime_log(shim, rootfs, tmp_path):
    argv, env = shim
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=9"])
    result = run_container(argv, bundle, env=env, log_file=str(tmp_path / "log.json"))
    assert not result.ok
    assert "unresolvable CDI device nvidia.com/gpu=9; looked in" in result.stderr
    assert "unresolvable CDI device nvidia.com/gpu=9" in result.log


def _jit_config(tmp_path, node, runtime: str, jit: str, mode: str = "jit-cdi") -> str:
    with open(node["config"]) as f:
        text = f.read()
    path = tmp_path / "config.toml"
    path.write_text(text + (
        "\n[nvidia-container-runtime]\n"
        f'mode = "{mode}"\n'
        f'runtimes = ["{runtime}"]\n'
        "\n[nvidia-container-runtime.modes.jit-cdi]\n" + jit))
    return str(path)


#: Inside: the SONAME link create-symlinks makes, and the MPS pipe dir the IPC discovery mounts.
_JIT_CHECK = ("ls /usr/lib/x86_64-linux-gnu/ | grep -c '^libcuda.so.1$'; "
              "grep -c ' /tmp/nvidia-mps ' /proc/self/mountinfo; "
              "ls /dev/nvidia0 /dev/nvidiactl")


@pytest.mark.parametrize("jit, links, mps", [
    ("", "1", "1"),
    ('nvcdi-disable-hooks = ["all"]\n', "0", "1"),
    ('nvcdi-disable-hooks = ["update-ldcache", "enable-cuda-compat"]\n', "1", "1"),
    ('nvcdi-feature-flags = ["disable-ipc-discoverer"]\n', "1", "0"),
    ('nvcdi-feature-flags = ["disable-ipc-discoverer", "no-such-flag"]\nnvcdi-disable-hooks = ["all"]\n', "0", "0"),
])
def test_jit_cdi_honours_nvcdi_feature_flags_and_disable_hooks(tmp_path, node, entry_points, oci_runtime, rootfs,
                                                                 jit, links, mps):
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=_jit_config(tmp_path, node, oci_runtime[0], jit))
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", _JIT_CHECK], ["NVIDIA_VISIBLE_DEVICES=0"])
    result = run_container([entry_points["nvidia-container-runtime"]], bundle, env=env,
                           log_file=str(tmp_path / "log.json"), timeout=60)
    assert result.ok, result.describe()
    lines = result.stdout.split()
    assert lines[:2] == [links, mps], result.describe()
    assert "/dev/nvidia0" in lines and "/dev/nvidiactl" in lines


@pytest.mark.parametrize("mode, device, jit, groups", [
    ("jit-cdi", "0", "", ["44"]),
    ("jit-cdi", "0", 'nvcdi-feature-flags = ["no-additional-gids-for-device-nodes"]\n', []),
    ("cdi", "runtime.nvidia.com/gpu=0", "", ["44"]),  # the automatic devices
    ("cdi", "runtime.nvidia.com/gpu=0", 'nvcdi-feature-flags = ["no-additional-gids-for-device-nodes"]\n', []),
])
def test_jit_cdi_gives_the_group_of_a_node_only_its_group_may_open(tmp_path, gated_node, entry_points, oci_runtime,
                                                                    rootfs, mode, device, jit, groups):
    """The render node is root:44 0660 on that node: its group joins the container's, as the reference's."""
    config = _jit_config(tmp_path, gated_node, oci_runtime[0], jit, mode)
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=config)
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", "ls /dev/dri; grep ^Groups: /proc/self/status"],
                         [f"NVIDIA_VISIBLE_DEVICES={device}", "NVIDIA_DRIVER_CAPABILITIES=graphics,utility"])
    result = run_container([entry_points["nvidia-container-runtime"]], bundle, env=env,
                           log_file=str(tmp_path / "log.json"), timeout=60)
    assert result.ok, result.describe()
    assert "renderD128" in result.stdout, result.describe()
    line = [ln for ln in result.stdout.splitlines() if ln.startswith("Groups:")][0]
    assert line.split()[1:] == groups, result.describe()
