"""GPU containers with a read-only root (``root.readonly``, Kubernetes' readOnlyRootFilesystem).

crun makes the root read-only before createContainer hooks run, so the hook
chain's links and ld cache could not be written (the reference fails the same
way: containers/crun#1924). The shim writes them before the runtime starts
(nvct.modifier.prepare); where the chain stays a hook (here: an image without an ld
cache, which only ldconfig can make), under crun the shim lets the chain's last
step make the root read-only instead; runc does it after the hooks itself.
Either way the container must get its GPU and libraries, and a root it cannot
write.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support.bundle import edit_config
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, run_gpu

pytestmark = pytest.mark.containers

#: Prints the GPU node, loads libcuda by SONAME (the ld cache), tries to write
#: the root, and prints the root mount's options.
CHECK = ("ls /dev/nvidia0 && dlopen-probe libcuda.so.1 && "
         "(touch /written 2>/dev/null && echo root-writable || echo root-read-only); "
         "awk '$5 == \"/\" {print \"root-options\", $6}' /proc/self/mountinfo")


def _read_only(spec: dict) -> None:
    spec["root"]["readonly"] = True


def _without_ld_cache(rootfs: str) -> None:
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))


@pytest.mark.parametrize("cache", [True, False], ids=["shim-writes", "hook-writes"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_read_only_root_gets_its_gpu_and_stays_read_only(tmp_path, sim_node, rootfs, runtime, mode, cache):
    need_runtime(runtime)
    if not cache:
        _without_ld_cache(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0"], command=CHECK, edit=_read_only)
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert lines[0] == "/dev/nvidia0"
    assert lines[1].startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/"), result.describe()
    assert lines[2] == "root-read-only"
    options = lines[3].split()[1].split(",")
    assert "ro" in options
    assert not mounts_under(rootfs)


@pytest.mark.parametrize("runtime, cache, root_readonly, last_steps", [
    ("crun", True, True, None),  # the shim wrote links and cache: only the params mask is left to the hook
    ("runc", True, True, None),
    ("crun", False, False, ["--", "readonly-root"]),  # moved into nvct's chain, its very last step
    ("runc", False, True, None),  # runc applies root.readonly after the hooks: left to runc
])
def test_what_the_shim_hands_each_runtime_for_a_read_only_root(tmp_path, sim_node, rootfs, runtime, cache,
                                                              root_readonly, last_steps):
    need_runtime(runtime)
    if not cache:
        _without_ld_cache(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0"], command="true", edit=_read_only)
    assert result.rc == 0, result.describe()
    with edit_config(tmp_path / "bundle") as spec:
        assert spec["root"]["readonly"] is root_readonly
        chains = [h for h in spec["hooks"]["createContainer"]  # the params mask alone is not the chain's work
                  if "chain" in h["args"]
                  and ("--" in h["args"] or h["args"][-1] != "disable-device-node-modification")]
        assert json.dumps(spec["hooks"]).count("readonly-root") == (1 if last_steps else 0)
        if last_steps:
            assert chains[0]["args"][-2:] == last_steps
        assert len(chains) == (0 if cache else 1)
