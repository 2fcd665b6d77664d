"""Malformed requests and hostile image files, through real runc and crun in every mode.

Each must end in a container with its GPU or a refusal with one clear line,
within seconds: Unicode digits in ids, IMEX channels from volume mounts,
config.json fields of the wrong JSON type, a FIFO or a self-including
ld.so.conf, many starts at once on one rootfs, and the configured host
ldconfig (``nvidia-container-cli.ldconfig``) reaching the update-ldcache step.
"""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, refusal, run_gpu

pytestmark = pytest.mark.containers

RUNTIMES = ["runc", "crun"]
DEVICE_LIST = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS = "accept-nvidia-visible-devices-as-volume-mounts = true"


def _show(line: str, text: str) -> None:
    assert line in text, text


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("env", [
    "NVIDIA_VISIBLE_DEVICES=\u00b2",  # superscript two: isdigit() but int() fails
    "NVIDIA_VISIBLE_DEVICES=\u0663",  # Arabic-Indic three: int() gives 3
    "NVIDIA_VISIBLE_DEVICES=0:\u0661",
])
def test_unicode_digits_in_device_ids_are_refused(tmp_path, sim_node, rootfs, runtime, mode, env):
    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=[env])
    _show("NVIDIA_VISIBLE_DEVICES: invalid value", refusal(result, tmp_path))
    assert not mounts_under(rootfs)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
def test_unicode_digits_in_imex_channels_are_refused(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=\u0663"])
    _show("NVIDIA_IMEX_CHANNELS: invalid value", refusal(result, tmp_path))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_imex_channels_from_volume_mounts_are_validated(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)

    def channel(name: str) -> dict:
        return {"destination": f"{DEVICE_LIST}/imex/{name}", "type": "bind", "source": "/dev/null",
                "options": ["rbind", "ro"]}

    good = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, top_config=VOLUME_MOUNTS,
                   env=["NVIDIA_VISIBLE_DEVICES=0"], mounts=[channel("1")],
                   command="ls /dev/nvidia-caps-imex-channels/", name="good")
    assert good.ok and good.stdout.split() == ["channel1"], good.describe()
    for bad in ("\u00b2", "x1", "99999999"):
        result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, top_config=VOLUME_MOUNTS,
                         env=["NVIDIA_VISIBLE_DEVICES=0"], mounts=[channel(bad)], name=f"bad{len(bad)}")
        _show("IMEX channel volume mount: invalid channel", refusal(result, tmp_path))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("field, value, line", [
    ("annotations", ["x"], "annotations must be an object, not an array"),
    ("mounts", {"a": 1}, "mounts must be an array, not an object"),
    ("process.env", ["NVIDIA_VISIBLE_DEVICES=0", 7], "process.env must hold only strings, not a number"),
    ("process.capabilities", "CAP_SYS_ADMIN", "process.capabilities must be an object or an array"),
    ("linux.devices", [1], "linux.devices must hold only objects, not a number"),
])
def test_wrong_json_types_name_the_field(tmp_path, sim_node, rootfs, runtime, field, value, line):
    need_runtime(runtime)

    def edit(spec: dict) -> None:
        parent, _, key = field.rpartition(".")
        target = spec
        for part in parent.split(".") if parent else ():
            target = target.setdefault(part, {})
        target[key] = value

    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0"], edit=edit)
    text = refusal(result, tmp_path)
    _show(line, text)
    assert "AttributeError" not in text and "TypeError" not in text


def _fifo_conf(rootfs: str) -> None:
    path = os.path.join(rootfs, "etc/ld.so.conf.d/fifo.conf")
    os.mkfifo(path)


def _self_including_conf(rootfs: str) -> None:
    with open(os.path.join(rootfs, "etc/ld.so.conf.d/loop.conf"), "w") as f:
        f.write("include /etc/ld.so.conf\n")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plant", [_fifo_conf, _self_including_conf], ids=["fifo", "self-include"])
def test_a_hostile_ld_so_conf_fails_within_seconds(tmp_path, sim_node, rootfs, runtime, mode, plant):
    """Where ldconfig must run (here: the image has no ld cache to patch), the conf is checked first."""
    need_runtime(runtime)
    plant(rootfs)
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, timeout=30,
                     env=["NVIDIA_VISIBLE_DEVICES=0"])
    assert not result.timed_out and result.duration < 10, result.describe()
    text = refusal(result, tmp_path)
    if not (runtime == "crun" and mode != "legacy"):  # crun hides a createContainer hook's stderr
        assert "not a regular file" in text or "includes itself" in text, result.describe()
    assert not mounts_under(rootfs)


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plant", [_fifo_conf, _self_including_conf], ids=["fifo", "self-include"])
def test_a_hostile_ld_so_conf_is_never_read_when_the_cache_is_patched(tmp_path, sim_node, rootfs, runtime,
                                                                      mode, plant):
    """The injected libraries' entries go into the image's cache without ldconfig, which would
    have read the conf; the container starts with its GPU at once."""
    need_runtime(runtime)
    plant(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, timeout=30,
                     env=["NVIDIA_VISIBLE_DEVICES=0"], command="dlopen-probe libcuda.so.1")
    assert result.rc == 0 and result.duration < 10, result.describe()
    assert result.stdout.startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/"), result.describe()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_concurrent_starts_on_one_rootfs(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    results = {}

    def start(i: int) -> None:
        work = tmp_path / f"run{i}"
        work.mkdir()
        results[i] = run_gpu(work, sim_node, rootfs, mode=mode, runtime=runtime,
                             env=["NVIDIA_VISIBLE_DEVICES=0"], timeout=120,
                             command="dlopen-probe libcuda.so.1")

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for result in results.values():
        assert result.ok, result.describe()
        assert "ok libcuda.so.1" in result.stdout, result.describe()
    assert not os.path.exists(os.path.join(rootfs, "etc/ld.so.cache~"))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
def test_the_configured_ldconfig_runs_the_ld_cache_update(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    missing = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, name="missing",
                      env=["NVIDIA_VISIBLE_DEVICES=0"], cli_config='ldconfig = "@/nonexistent/ldconfig.real"')
    text = refusal(missing, tmp_path)
    if not (runtime == "crun" and mode != "legacy"):
        assert "/nonexistent/ldconfig.real" in text, missing.describe()

    real = tmp_path / "sbin" / "ldconfig.real"  # Ubuntu's name for the binary behind a wrapper
    real.parent.mkdir()
    shutil.copy2("/sbin/ldconfig", real)
    (tmp_path / "nvct.log").unlink(missing_ok=True)
    ok = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, name="ok",
                 env=["NVIDIA_VISIBLE_DEVICES=0"], cli_config=f'ldconfig = "@{real}"',
                 command="dlopen-probe libcuda.so.1")
    assert ok.ok and "ok libcuda.so.1" in ok.stdout, ok.describe()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
def test_an_ldconfig_wrapper_script_means_the_real_binary_beside_it(tmp_path, sim_node, rootfs, runtime, mode):
    """Ubuntu's layout, seen on a real GPU node: /sbin/ldconfig is a shell wrapper and the binary is
    /sbin/ldconfig.real. As in NVIDIA's toolkit, the configured wrapper's name means the binary."""
    need_runtime(runtime)
    wrapper = tmp_path / "sbin" / "ldconfig"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\nexec /sbin/ldconfig.real "$@"\n')
    wrapper.chmod(0o755)
    shutil.copy2("/sbin/ldconfig", tmp_path / "sbin" / "ldconfig.real")
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     cli_config=f'ldconfig = "@{wrapper}"', command="dlopen-probe libcuda.so.1")
    assert result.ok and "ok libcuda.so.1" in result.stdout, result.describe()
