"""What the shim logs on a container start: one structured line, and with log-level debug every
file read and decision made -- so an operator can tell what happened from the log alone."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from nvct.doctor import explain
from tests.support.bundle import make_bundle
from tests.support.fixtures import need_binaries, rootfs  # noqa: F401 - fixtures
from tests.support.runtimes import RUNC, run_container

from .nodes import clean_env, entry_point, write


@pytest.fixture
def shim(node, tmp_path):
    """Run the real shim's ``create`` on a GPU bundle; returns (log lines, bundle)."""
    log = str(tmp_path / "runtime.log")
    node.write_config(extra=f'debug = "{log}"\nlog-level = "debug"\n')
    binary = entry_point("nvidia-container-runtime", str(tmp_path))

    def run(*global_args: str, env=("NVIDIA_VISIBLE_DEVICES=1",)) -> list[str]:
        bundle = str(tmp_path / "bundle")
        os.makedirs(os.path.join(bundle, "rootfs"), exist_ok=True)
        write(os.path.join(bundle, "config.json"), json.dumps(explain.spec_from_options(env)))
        result = subprocess.run([binary, *global_args, "--root", str(tmp_path / "state"), "create",
                                 "--bundle", bundle, "ctr-42"], capture_output=True, text=True, timeout=60,
                                env=clean_env(NVIDIA_CTK_CONFIG_FILE_PATH=node.config))
        assert result.returncode == 0, result.stderr
        if not os.path.exists(log):
            return []
        with open(log) as f:
            return f.read().splitlines()

    return run


def test_one_json_line_per_container_start_with_id_mode_devices_and_time(node, shim):
    lines = [json.loads(line) for line in shim("--log-format", "json")]
    starts = [line for line in lines if line["msg"] == "container start"]
    assert len(starts) == 1
    start = starts[0]
    assert start["level"] == "info" and start["id"] == "ctr-42" and start["mode"] == "jit-cdi"
    assert start["devices"] == ["1"] and start["capabilities"] == ["compute", "utility"]
    assert isinstance(start["ms"], float) and start["ms"] > 0
    assert start["time"].endswith("Z")


def test_debug_lines_name_every_file_read_and_the_mode_decision(node, shim):
    text = "\n".join(shim())
    proc = node.path("proc")
    assert f"driver version 550.54.15 (read {proc}/driver/nvidia/version)" in text
    assert f"read {proc}/devices: nvidia majors" in text
    assert f"read {proc}/driver/nvidia/gpus/*/information: 8 GPU(s)" in text
    assert f"read {node.path('etc/ld.so.cache')}: " in text
    assert "mode jit-cdi: auto: devices requested by id, edits computed at create time" in text
    assert "NVIDIA_VISIBLE_DEVICES: '1' is GPU 1 (GPU-" in text
    assert "edits for Request(devices=('1',)" in text
    last = text.splitlines()[-1]  # "<time> info container start id=... ms=..."
    assert (' info container start id="ctr-42" mode="jit-cdi" devices=["1"] capabilities=["compute", "utility"] '
            'ms=') in last


def test_a_library_left_out_is_said_in_the_debug_log(node, shim, node535):
    lib = node.path("usr/lib/x86_64-linux-gnu")
    old = os.path.join(node535["roots"]["driver_root"], "usr/lib/x86_64-linux-gnu/libcuda.so.535.161.08")
    subprocess.run(["cp", old, lib], check=True)
    os.unlink(os.path.join(lib, "libcuda.so.1"))
    os.symlink("libcuda.so.535.161.08", os.path.join(lib, "libcuda.so.1"))
    node.regenerate_ldcache()
    text = "\n".join(shim())
    assert ("skipping libcuda.so.1 => /usr/lib/x86_64-linux-gnu/libcuda.so.1 (x86_64): "
            "/usr/lib/x86_64-linux-gnu/libcuda.so.535.161.08 is not of driver 550.54.15") in text


def test_a_container_without_a_gpu_logs_nothing(shim):
    assert shim(env=("FOO=bar",)) == []


@pytest.mark.containers
def test_a_legacy_start_logs_the_shims_line_and_the_hooks_line(node, tmp_path, rootfs):
    """Under real runc: the shim logs the hook it inserted, the hook what it injected."""
    need_binaries(RUNC)
    log = tmp_path / "legacy.log"
    hook = entry_point("nvidia-container-runtime-hook", str(tmp_path))
    config = tmp_path / "legacy.toml"
    config.write_text(
        f'[nvidia-container-cli]\nroot = "{node.dir}"\n\n'
        f'[nvct]\ndev-root = "{node.dir}"\nproc-root = "{node.path("proc")}"\n\n'
        f'[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["{RUNC}"]\ndebug = "{log}"\n\n'
        f'[nvidia-container-runtime-hook]\npath = "{hook}"\n')
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], ["NVIDIA_VISIBLE_DEVICES=2"])
    shim = entry_point("nvidia-container-runtime", str(tmp_path))
    result = run_container([shim], bundle, "legacy-7", env=clean_env(NVIDIA_CTK_CONFIG_FILE_PATH=str(config)),
                           log_file=str(tmp_path / "runc.log"))
    assert result.ok, result.describe()
    shim_line, hook_line = log.read_text().splitlines()[-2:]
    # The shim had --log-format json (as under docker) and hands the format to the hook it inserts.
    assert {k: v for k, v in json.loads(shim_line).items() if k not in ("time", "ms")} == {
        "level": "info", "msg": "container start", "id": "legacy-7", "mode": "legacy", "devices": ["2"],
        "capabilities": ["compute", "utility"]}
    hook_record = json.loads(hook_line)
    assert {k: hook_record[k] for k in ("level", "msg", "id", "mode", "devices", "nodes")} == {
        "level": "info", "msg": "container start", "id": "legacy-7", "mode": "legacy-hook", "devices": ["2"],
        "nodes": 5}
    assert hook_record["mounts"] > 0 and hook_record["ms"] > 0
