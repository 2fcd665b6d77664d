"""Everything a request can ask for is realized, in legacy and jit-cdi mode, under runc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.e2e.conftest import PATH_ENV, SHIM, node_config
from tests.support.bundle import make_bundle
from tests.support.fixtures import skip
from tests.support.runtimes import run_container

pytestmark = pytest.mark.containers

MODES = ("legacy", "jit-cdi")


def run_gpu(tmp_path, node, rootfs, mode, env, command, privileged=False):
    config = node_config(tmp_path, node, mode=mode)
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", command],
                         env=[PATH_ENV, *env], privileged=privileged)
    result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                                "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert result.rc == 0, result.describe()
    return result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_mig_config_and_monitor_for_privileged_containers(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    out = run_gpu(tmp_path, sim_node, rootfs, mode,
                  ["NVIDIA_VISIBLE_DEVICES=none", "NVIDIA_MIG_CONFIG_DEVICES=0", "NVIDIA_MIG_MONITOR_DEVICES=0"],
                  "ls -l /dev/nvidia-caps/ /dev/nvidia0", privileged=True)
    assert "nvidia-cap1" in out and "nvidia-cap2" in out and "/dev/nvidia0" in out


@pytest.mark.parametrize("mode", MODES)
def test_imex_channels(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    out = run_gpu(tmp_path, sim_node, rootfs, mode, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_IMEX_CHANNELS=1"],
                  "ls /dev/nvidia-caps-imex-channels/")
    assert out.split() == ["channel1"]


@pytest.mark.parametrize("mode", MODES)
def test_graphics_and_display(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    out = run_gpu(tmp_path, sim_node, rootfs, mode,
                  ["NVIDIA_VISIBLE_DEVICES=2", "NVIDIA_DRIVER_CAPABILITIES=graphics,display"],
                  "ls /dev/dri; cat /etc/vulkan/icd.d/nvidia_icd.json; "
                  "dlopen-probe libGLX_nvidia.so.0 libEGL_nvidia.so.0")
    assert "card2" in out and "renderD130" in out and "card1" not in out
    assert '"library_path" : "libGLX_nvidia.so.0"' in out
    assert "ok libGLX_nvidia.so.0" in out and "ok libEGL_nvidia.so.0" in out


@pytest.mark.parametrize("mode", MODES)
def test_compat32_libraries(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    out = run_gpu(tmp_path, sim_node, rootfs, mode,
                  ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,compat32"],
                  "ls /usr/lib/i386-linux-gnu/; /sbin/ldconfig -p | grep 'libcuda.so.1 (libc6)'")
    assert "libcuda.so.550.54.15" in out
    assert "/usr/lib/i386-linux-gnu/libcuda.so.1" in out


@pytest.mark.parametrize("compat_version, loaded_from", [
    ("580.65.06", "/usr/local/cuda/compat"),       # newer than the host's 550: used
    ("535.104.05", "/usr/lib/x86_64-linux-gnu"),   # older: ignored
])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_forward_compat_libraries_only_when_newer(tmp_path, sim_node, rootfs, gpu_runtimes, mode,
                                                       compat_version, loaded_from):
    compat = os.path.join(rootfs, "usr/local/cuda/compat")
    os.makedirs(compat)
    lib = os.path.join(sim_node["roots"]["driver_root"], "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
    shutil.copy(lib, os.path.join(compat, f"libcuda.so.{compat_version}"))
    os.symlink(f"libcuda.so.{compat_version}", os.path.join(compat, "libcuda.so.1"))
    out = run_gpu(tmp_path, sim_node, rootfs, mode, ["NVIDIA_VISIBLE_DEVICES=0"], "dlopen-probe libcuda.so.1")
    assert out.strip() == f"ok libcuda.so.1 {loaded_from}/libcuda.so.1"


@pytest.fixture(scope="module")
def node_with_extra_devices(tmp_path_factory):
    """A node of its own with the device classes NVIDIA_GDS/MOFED/NVSWITCH/GDRCOPY switch on."""
    if os.geteuid() != 0:
        skip("needs root (mknod)")
    from nvct.simulate.node import build_node

    node = build_node(tmp_path_factory.mktemp("extra") / "node")
    root = node["roots"]["dev_root"]
    for path, major, minor in (("dev/nvidia-fs0", 246, 0), ("dev/nvidia-fs1", 246, 1),
                               ("dev/infiniband/uverbs0", 231, 192), ("dev/infiniband/rdma_cm", 10, 58),
                               ("dev/nvidia-nvswitchctl", 195, 253), ("dev/nvidia-nvswitch0", 195, 252),
                               ("dev/gdrdrv", 239, 0)):
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        subprocess.run(["mknod", "-m", "666", os.path.join(root, path), "c", str(major), str(minor)], check=True)
    with open(os.path.join(node["roots"]["driver_root"], "etc/cufile.json"), "w") as f:
        f.write('{"logging": {"level": "ERROR"}}\n')
    return node


@pytest.mark.parametrize("mode", MODES)
def test_gated_device_classes(tmp_path, node_with_extra_devices, rootfs, gpu_runtimes, mode):
    out = run_gpu(tmp_path, node_with_extra_devices, rootfs, mode,
                  ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_GDS=enabled", "NVIDIA_MOFED=enabled",
                   "NVIDIA_NVSWITCH=enabled", "NVIDIA_GDRCOPY=enabled"],
                  "find /dev -type c | sort; cat /etc/cufile.json")
    for path in ("/dev/nvidia-fs0", "/dev/nvidia-fs1", "/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm",
                 "/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch0", "/dev/gdrdrv"):
        assert path in out
    assert '"logging"' in out


def test_gated_device_classes_stay_out_unless_enabled(tmp_path, node_with_extra_devices, rootfs, gpu_runtimes):
    out = run_gpu(tmp_path, node_with_extra_devices, rootfs, "jit-cdi", ["NVIDIA_VISIBLE_DEVICES=0"],
                  "find /dev -type c | sort")
    assert "nvidia-fs" not in out and "gdrdrv" not in out and "infiniband" not in out
