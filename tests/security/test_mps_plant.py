"""An image aims later mount targets and links at the read-write MPS pipe dir.

/tmp/nvidia-mps is bind-mounted read-write from the host into every compute
container. An image whose firmware folder (``/lib/firmware/nvidia/<version>``)
or library folder (``/usr/lib/x86_64-linux-gnu``) is a symlink to
``/tmp/nvidia-mps`` once had runc create firmware and library mount targets,
and nvct's hook SONAME links and ld.so.conf entries, in the host's MPS
directory. Writable mounts now come last in every mode, and nvct never
creates anything across a mount boundary an image symlink led to: through
real runc and crun, in legacy, jit-cdi and cdi mode, the host's MPS
directory must stay exactly as it was and the container either runs with
its GPU or is refused with one clear line.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.security.conftest import snapshot
from tests.support.fixtures import rootfs  # noqa: F401
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, refusal, run_gpu

pytestmark = pytest.mark.containers

MPS = "/tmp/nvidia-mps"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _plant(rootfs: str, folder: str) -> None:
    path = os.path.join(rootfs, folder.lstrip("/"))
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)  # empty in the test image (its libc lives in /lib/x86_64-linux-gnu)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(MPS, path)
    # The image's own /tmp/nvidia-mps exists, so the link resolves before the MPS mount too.
    os.makedirs(os.path.join(rootfs, MPS.lstrip("/")), exist_ok=True)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plant", ["firmware", "libdir"])
def test_nothing_lands_in_the_hosts_mps_directory(tmp_path, sim_node, rootfs, runtime, mode, plant):
    need_runtime(runtime)
    host_mps = os.path.join(sim_node["roots"]["driver_root"], MPS.lstrip("/"))
    assert os.path.isdir(host_mps)
    folder = f"/lib/firmware/nvidia/{sim_node['driver_version']}" if plant == "firmware" else LIBDIR
    _plant(rootfs, folder)
    before = snapshot(host_mps)

    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0"], command=f"ls -A {MPS}; ls /dev/nvidia0")

    assert snapshot(host_mps) == before, result.describe()
    assert not mounts_under(rootfs), result.describe()
    if result.ok:
        assert "/dev/nvidia0" in result.stdout
    else:
        # The hook refuses to write through the planted link onto the MPS mount.
        text = refusal(result, tmp_path)
        # crun does not show a createContainer hook's stderr, and nvct hook chain has no log file.
        if not (runtime == "crun" and mode != "legacy"):
            assert "onto another mount" in text, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", MODES)
def test_ldconfig_makes_no_links_in_the_hosts_mps_directory(tmp_path, sim_node, rootfs, runtime, mode):
    """The image lists /tmp/nvidia-mps in its ld.so.conf, where another container left a library."""
    need_runtime(runtime)
    host_mps = os.path.join(sim_node["roots"]["driver_root"], MPS.lstrip("/"))
    planted = os.path.join(host_mps, "libplanted.so.9.9")
    shutil.copy2(os.path.join(rootfs, "lib/x86_64-linux-gnu/libm.so.6"), planted)  # SONAME libm.so.6
    try:
        with open(os.path.join(rootfs, "etc/ld.so.conf.d/mps.conf"), "w") as f:
            f.write(MPS + "\n")
        before = snapshot(host_mps)
        result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                         env=["NVIDIA_VISIBLE_DEVICES=0"], command="dlopen-probe libcuda.so.1")
        assert snapshot(host_mps) == before, result.describe()
        assert result.ok and "ok libcuda.so.1" in result.stdout, result.describe()
    finally:
        os.unlink(planted)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_no_target_is_created_in_an_engine_volume(tmp_path, sim_node, rootfs, runtime, mode):
    """A user's read-write volume comes before nvct's mounts; the image links the library folder to it."""
    need_runtime(runtime)
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "data.txt").write_text("user data\n")
    os.makedirs(os.path.join(rootfs, "data"))
    _plant(rootfs, LIBDIR)
    os.unlink(os.path.join(rootfs, LIBDIR.lstrip("/")))
    os.symlink("/data", os.path.join(rootfs, LIBDIR.lstrip("/")))
    before = snapshot(volume)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     mounts=[{"destination": "/data", "type": "bind", "source": str(volume),
                              "options": ["rbind", "rw"]}])
    assert snapshot(volume) == before, result.describe()
    assert "into the bind mount at /data" in refusal(result, tmp_path), result.describe()
    assert not mounts_under(rootfs)
