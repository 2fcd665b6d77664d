"""Faults during a GPU container's create give one line naming the file, and leave nothing half done.

A full bundle directory or container root (a small tmpfs filled up), a
config.toml caught while it is being rewritten: through the shim and the real
runtimes, the start either works with its GPU or fails with one line naming
the file at fault, and nothing is left written into the container's root or
the bundle.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from tests.security.conftest import snapshot
from tests.support.bundle import make_bundle
from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import PATH_ENV, SHIM, mounts_under, need_runtime, node_config, refusal, run_gpu
from tests.support.legacy_front import age, gpu_front, run as run_front
from tests.support.runtimes import RUNTIMES, run_container

pytestmark = pytest.mark.containers

#: Fills the file system of $1 (a filler file there), then runs the rest: the shim.
FILL = ["sh", "-c", 'cat /dev/zero > "$1/.filler" 2>/dev/null; shift; exec "$@"', "fill"]


def _small_tmpfs(path, size: str = "4m") -> str:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    return str(path)


@pytest.fixture
def tmpfs_mounts():
    made: list[str] = []
    yield made
    for path in reversed(made):
        subprocess.run(["umount", "-l", path], check=False)


def _root_state(rootfs: str) -> dict:
    """Every file and link under the root's /etc and /usr (a folder's times aside: a temporary came and went)."""
    return {f"{part}/{k}": v[:5] + v[7:] if stat.S_ISDIR(v[0]) else v
            for part in ("etc", "usr") for k, v in snapshot(os.path.join(rootfs, part)).items()}


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi", "legacy"])
def test_full_bundle_fails_naming_config_json_with_the_root_untouched(tmp_path, sim_node, rootfs, runtime, mode,
                                                                      tmpfs_mounts):
    need_runtime(runtime)
    bundle = str(tmp_path / "bundle")
    tmpfs_mounts.append(_small_tmpfs(bundle))
    before = _root_state(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     wrapper=[*FILL, bundle])
    text = refusal(result, tmp_path)
    assert f"{bundle}/config.json" in text and "No space left on device" in text, result.describe()
    assert _changed(before, _root_state(rootfs)) == []
    assert sorted(os.listdir(bundle)) == [".filler", "config.json"]
    assert not mounts_under(rootfs)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_full_root_fails_naming_the_file_with_the_root_untouched(tmp_path, sim_node, rootfs, runtime, mode,
                                                                 tmpfs_mounts):
    need_runtime(runtime)
    small = _small_tmpfs(tmp_path / "small", "64m")
    tmpfs_mounts.append(small)
    root = os.path.join(small, "rootfs")
    subprocess.run(["cp", "-a", rootfs, root], check=True)
    before = _root_state(root)
    result = run_gpu(tmp_path, sim_node, root, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     wrapper=[*FILL, small])
    text = refusal(result, tmp_path)
    line = next(t for t in text.splitlines() if "No space left on device" in t)
    assert f"in container root {root}" in line, result.describe()
    assert _changed(before, _root_state(root)) == []
    assert not mounts_under(root)


def test_half_written_config_is_an_error_naming_it(tmp_path, sim_node, rootfs):
    """A config.toml held open by its writer, caught cut short: never the defaults."""
    need_runtime("runc")
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=RUNTIMES["runc"][0])
    with open(config, "rb") as f:
        whole = f.read()
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    with open(config, "wb") as writer:  # truncated, the first lines written, the writer not done
        writer.write(whole[:whole.index(b"\n[") + 1])
        writer.flush()
        result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ["PATH"]},
                               timeout=60)
    assert not result.ok, result.describe()
    assert config in result.stderr and "being written" in result.stderr, result.describe()
    assert "driver" not in result.stderr, result.describe()


def test_config_truncated_mid_line_is_an_error_naming_it(tmp_path, sim_node, rootfs):
    need_runtime("runc")
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=RUNTIMES["runc"][0])
    with open(config, "rb") as f:
        whole = f.read()
    with open(config, "wb") as f:
        f.write(whole[:whole.index(b"mode = ") + 9])
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ["PATH"]},
                           timeout=60)
    assert not result.ok
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and config in lines[0] and "invalid TOML" in lines[0], result.describe()


def _python_creates(front) -> int:
    with open(front.log) as f:
        return sum([w for w in line.split(" ") if not w.startswith("-")][:1]
                   == [os.path.join(front.dir, "nvidia-container-runtime")]  # the launcher, after python's flags
                   and (" run --bundle" in line or " create " in line)
                   for line in f)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_legacy_hook_uses_the_config_the_shim_decided_with(tmp_path, sim_node, rootfs, runtime):
    """config.toml rewritten (here: broken) between the shim's accept and the hook: the container still gets
    its GPU, whether the sh front appended the recorded hook or the Python shim did."""
    need_runtime(runtime)
    flag, wrapper = tmp_path / "break-config", tmp_path / "lowlevel"
    config = str(tmp_path / "front/legacy.toml")  # gpu_front's
    wrapper.write_text(f'#!/bin/sh\nif [ -e {flag} ]; then rm -f {flag}; printf "[broken\\n" > {config}; fi\n'
                       f'exec {RUNTIMES[runtime][0]} "$@"\n')
    wrapper.chmod(0o755)
    front, config = gpu_front(tmp_path / "front", sim_node["config"], str(wrapper))
    with open(config, "rb") as f:
        whole = f.read()
    for i, python in enumerate([0, 1]):  # the front's record; the Python shim (the config changed: not recorded)
        flag.touch()
        bundle = make_bundle(tmp_path / f"bundle{i}", rootfs, ["sh", "-c", "dlopen-probe libcuda.so.1"],
                             env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
        before = _python_creates(front)
        result = run_front(front, config, bundle)
        assert result.ok and result.stdout.startswith("ok libcuda.so.1 /"), (i, result.describe())
        assert not flag.exists() and _python_creates(front) - before == python
        with open(config, "wb") as f:
            f.write(whole)
        age(config)


#: The shim in-process, with the first library of its edits taken away once they are computed (an upgrade).
_VANISH = """
import os, sys
from nvct.modifier import modes; from nvct.programs import shim
real = modes.modify
def modify(*args, **kwargs):
    result = real(*args, **kwargs)
    lib = next(m.host_path for m in result.edits.mounts if "libnvidia-ml.so." in m.host_path)
    os.rename(lib, lib + ".upgraded")
    print(lib, file=sys.stdout, flush=True)
    return result
modes.modify = modify
sys.exit(shim.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_library_gone_mid_start_is_one_line_naming_it(tmp_path, sim_node, rootfs, mode):
    need_runtime("runc")
    config = node_config(tmp_path, sim_node, mode=mode, runtime=RUNTIMES["runc"][0])
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    before = _root_state(rootfs)
    proc = subprocess.run([sys.executable, "-c", _VANISH, "--root", str(tmp_path / "state"), "create", "--bundle",
                           bundle, "c1"], capture_output=True, text=True, timeout=60,
                          env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ["PATH"]})
    lib = proc.stdout.strip()
    assert lib, proc.stderr
    os.rename(lib + ".upgraded", lib)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"nvidia-container-runtime: {lib}: gone while the container was being "
                                        "created: the driver changed during the start (an upgrade?); start the "
                                        "container again"]
    assert _changed(before, _root_state(rootfs)) == []


def test_config_rewritten_in_a_loop_fails_no_accepted_legacy_container(tmp_path, sim_node, rootfs):
    """config.toml rewritten in place (truncated, then written in two parts) every 10 ms while legacy
    GPU containers start: a start the runtime accepted never fails in its hook."""
    need_runtime("runc")
    front, config = gpu_front(tmp_path / "front", sim_node["config"], RUNTIMES["runc"][0])
    with open(config, "rb") as f:
        whole = f.read()
    variants = [whole, whole.replace(b"[nvidia-container-runtime]", b"# rewritten\n[nvidia-container-runtime]", 1)]
    stop = threading.Event()

    def rewrite():
        i = 0
        while not stop.wait(0.01):
            data = variants[i % 2]
            with open(config, "wb") as f:  # in place, as `cat > config.toml` or a naive editor does
                f.write(data[:len(data) // 2])
                f.flush()
                f.write(data[len(data) // 2:])
            i += 1

    writer = threading.Thread(target=rewrite)
    writer.start()
    outcomes = []
    try:
        for i in range(12):
            bundle = make_bundle(tmp_path / f"bundle{i}", rootfs, ["sh", "-c", "dlopen-probe libcuda.so.1"],
                                 env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
            outcomes.append(run_front(front, config, bundle))
    finally:
        stop.set()
        writer.join()
    for result in outcomes:
        assert "nvidia-container-runtime-hook" not in result.stderr, result.describe()
        if result.ok:
            assert result.stdout.startswith("ok libcuda.so.1 /"), result.describe()
        else:  # refused before the runtime: one line naming the config
            assert [line for line in result.stderr.splitlines() if "level=" not in line] == \
                [f"nvidia-container-runtime: {config}: being written by another process (open for writing, or "
                 "changed while read); not used"], result.describe()
    assert sum(r.ok for r in outcomes) >= 6, [r.stderr for r in outcomes]
