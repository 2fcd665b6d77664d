"""The shim's own writes into a hostile image (nvct.modifier.prepare), through the real runtimes.

For jit-cdi and cdi mode the shim writes the links, the ld cache and its conf
file into the container's root from the host, before runc or crun run. An
image aims those paths at the host: its library folder, /etc, the cache or
ld.so.conf.d is a symlink to a host directory (absolute, or relative enough to
climb out). The host tree must stay exactly as it was, nothing may stay
mounted, and the container either runs with its GPU (the links resolve in its
own root: jit-cdi and cdi mode) or is refused with one line naming the root
(legacy mode, whose hook refuses a dangling library folder).
"""

from __future__ import annotations

import os

import pytest

from tests.security.conftest import snapshot
from tests.support.bundle import read_config
from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, refusal, run_gpu

pytestmark = pytest.mark.containers

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PLANTS = {  # container path -> the host directory it is aimed at (under tmp_path/host)
    "libdir": (LIBDIR, "lib"),
    "etc": ("/etc/ld.so.conf.d", "etc/ld.so.conf.d"),
    "cache": ("/etc/ld.so.cache", "etc/ld.so.cache"),
}


def _host(tmp_path) -> str:
    host = tmp_path / "host"
    (host / "lib").mkdir(parents=True)
    (host / "lib/libhost.so.1").write_text("the host's\n")
    (host / "etc/ld.so.conf.d").mkdir(parents=True)
    (host / "etc/ld.so.conf.d/host.conf").write_text("/opt/host\n")
    (host / "etc/ld.so.cache").write_bytes(b"the host's cache\n")
    return str(host)


def _plant(rootfs: str, container_path: str, target: str, kind: str) -> None:
    path = os.path.join(rootfs, container_path.lstrip("/"))
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):  # the test image's conf files; its libc lives elsewhere
            os.unlink(os.path.join(path, name))
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)
    if kind == "relative":
        target = "../" * (container_path.count("/") + 8) + target.lstrip("/")
    os.symlink(target, path)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["absolute", "relative"])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_image_links_aimed_at_the_host_leave_it_untouched(tmp_path, sim_node, rootfs, runtime, mode, kind, plant):
    need_runtime(runtime)
    host = _host(tmp_path)
    before = snapshot(host)
    container_path, inside = PLANTS[plant]
    _plant(rootfs, container_path, os.path.join(host, inside), kind)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="dlopen-probe libcuda.so.1")
    assert snapshot(host) == before, result.describe()
    assert not mounts_under(rootfs)
    if mode != "legacy":
        hooks = [h["path"] for h in read_config(tmp_path / "bundle").get("hooks", {}).get("createContainer", [])]
        if plant == "cache":  # no cache in the root to patch: the chain stays a hook, ldconfig makes one
            assert len(hooks) == 1 and hooks[0] != "/bin/sh", hooks
        else:  # the shim did the writes itself: no chain hook (a params mask at most)
            assert hooks in ([], ["/bin/sh"]), hooks
    if result.ok:
        assert result.stdout.startswith("ok libcuda.so.1 /"), result.describe()
    else:  # no traceback; runc shows the reason (crun hides a hook's stderr)
        text = refusal(result, tmp_path)
        assert runtime == "crun" or "in container root" in text, result.describe()
