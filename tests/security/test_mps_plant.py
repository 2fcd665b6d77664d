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

Podman (like containerd and cri-o) applies a spec itself and sorts its mounts
by depth, so generated specs leave the MPS dir to the hook chain's last step:
through podman under runc and crun, the same plants leave the host's MPS
directory as it was, and the container runs with it mounted read-write.
"""

from __future__ import annotations

import os
import secrets
import shutil

import pytest

from tests.security.conftest import snapshot
from tests.support.fixtures import need_binaries, rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import MODES, generate_spec, mounts_under, need_runtime, refusal, run_gpu
from tests.support.image import ImageSpec, build_image_tar
from tests.support.podman import CDI_DIRS, PODMAN, Podman, cdi_spec, unique_cdi_vendor
from tests.support.runtimes import RUNTIMES

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
@pytest.mark.parametrize("plant", ["firmware", "libdir", "vulkan-icd", "opencl-icd"])
def test_nothing_lands_in_the_hosts_mps_directory(tmp_path, sim_node, rootfs, runtime, mode, plant):
    need_runtime(runtime)
    host_mps = os.path.join(sim_node["roots"]["driver_root"], MPS.lstrip("/"))
    assert os.path.isdir(host_mps)
    folder = {"firmware": f"/lib/firmware/nvidia/{sim_node['driver_version']}", "libdir": LIBDIR,
              "vulkan-icd": "/etc/vulkan/icd.d", "opencl-icd": "/etc/OpenCL/vendors"}[plant]
    _plant(rootfs, folder)
    before = snapshot(host_mps)

    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=f"ls -A {MPS}; ls /dev/nvidia0",
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"])

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


@pytest.fixture(scope="module", params=["runc", "crun"])
def cdi_podman(request, tmp_path_factory, sim_node):
    """(podman under runc or crun, vendor): podman applies the node's generated spec itself."""
    need_runtime(request.param)
    need_binaries(PODMAN)
    spec = generate_spec(tmp_path_factory.mktemp("cdi-spec"), sim_node["config"], vendor=unique_cdi_vendor())
    with open(spec) as f:
        text = f.read()
    vendor = text.split("kind: ", 1)[1].split("/", 1)[0]
    with Podman(runtime=RUNTIMES[request.param][0]) as podman, \
            cdi_spec(text, directory=CDI_DIRS[1], suffix=".yaml"):
        yield podman, vendor


@pytest.mark.parametrize("plant", ["none", "firmware", "libdir"])
def test_podman_applying_the_generated_spec_creates_nothing_in_the_hosts_mps_directory(
        cdi_podman, tmp_path, sim_node, rootfs, plant):
    """The CDI library sorts every mount by depth (fewer components first), so a spec cannot
    keep the MPS dir after the libraries and firmware: nvct's createContainer hook mounts it."""
    podman, vendor = cdi_podman
    host_mps = os.path.join(sim_node["roots"]["driver_root"], MPS.lstrip("/"))
    if plant != "none":
        _plant(rootfs, f"/lib/firmware/nvidia/{sim_node['driver_version']}" if plant == "firmware" else LIBDIR)
    image = ImageSpec(name=f"localhost/nvct-mps-{plant}", tag="t")
    build_image_tar(rootfs, tmp_path / "image.tar", image.name, image.tag)
    podman.load(tmp_path / "image.tar")
    marker = f"nvct-marker-{secrets.token_hex(4)}"
    existing = set(os.listdir(host_mps))
    with open(os.path.join(host_mps, marker), "w") as f:
        f.write("host mps\n")
    try:
        before = snapshot(host_mps)
        result = podman.run(["--rm", "--device", f"{vendor}/gpu=0", image.ref, "sh", "-c",
                             f"cat {MPS}/{marker}; grep ' {MPS} ' /proc/self/mountinfo; ls /dev/nvidia0"])
        assert snapshot(host_mps) == before, result.describe()
    finally:
        for name in set(os.listdir(host_mps)) - existing:  # the node is the session's: leave it clean
            path = os.path.join(host_mps, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    # The container runs with its GPU and the host's MPS dir, mounted as the spec mount was.
    assert result.ok and result.stdout.startswith("host mps\n"), result.describe()
    assert result.stdout.splitlines()[-1] == "/dev/nvidia0", result.describe()
    mountinfo = result.stdout.splitlines()[1].split()
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(mountinfo[5].split(",")), result.describe()
    assert mountinfo[6] == "-", result.describe()  # no propagation tag: rprivate
