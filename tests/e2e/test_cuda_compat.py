"""CUDA forward compat by the compat libcuda's note, as containers see it (runc and crun).

The image holds /usr/local/cuda/compat/libcuda.so.575.57.08, a copy of the
simulated node's libcuda (driver 550.54.15, CUDA 12.4) carrying a real
``.note.cuda.fwd_compatibility``; dlopen-probe says which libcuda.so.1 the
container's loader picks. One note per case: the host's branch listed, the
host's branch excluded, a newer CUDA (a spec passing ``--host-cuda-version``,
as NVIDIA's generator writes), the device (brand) list.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.support.bundle import make_bundle
from tests.support.compat import NOTE_575, make_compat_libcuda, mixed_brands_node
from tests.support.gpu_runs import PATH_ENV, SHIM, generate_spec, need_runtime, node_config, run_gpu, spec_dir
from tests.support.runtimes import RUNTIMES, run_container

pytestmark = pytest.mark.containers

COMPAT = "/usr/local/cuda/compat"
HOST = "/usr/lib/x86_64-linux-gnu"


def _image(sim_node, rootfs, note):
    lib = os.path.join(sim_node["roots"]["driver_root"], HOST.lstrip("/"), f"libcuda.so.{sim_node['driver_version']}")
    compat = os.path.join(rootfs, COMPAT.lstrip("/"))
    make_compat_libcuda(lib, os.path.join(compat, "libcuda.so.575.57.08"), note)
    os.symlink("libcuda.so.575.57.08", os.path.join(compat, "libcuda.so.1"))


def _loaded(result) -> str:
    assert result.rc == 0, result.describe()
    return result.stdout.strip()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
@pytest.mark.parametrize("branches, folder", [
    ([535, 550, 560, 565, 570, 575], COMPAT),  # the host's 550 listed: the compat libcuda loads
    ([570, 575], HOST),                         # 550 excluded (the old rule took it: CUDA error 804)
])
def test_the_note_decides_which_libcuda_loads(tmp_path, sim_node, rootfs, runtime, mode, branches, folder):
    need_runtime(runtime)
    # the keys as the packages write them (the reference reads them case-blind)
    _image(sim_node, rootfs, {"format": 1, "CUDA version": "12.9", "driver": branches, "device": [2, 14]})
    out = _loaded(run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                          env=["NVIDIA_VISIBLE_DEVICES=0"], command="dlopen-probe libcuda.so.1"))
    assert out == f"ok libcuda.so.1 {folder}/libcuda.so.1"


def _cdi_spec_with(tmp_path, sim_node, runtime, args: str) -> str:
    """A cdi-mode config whose spec's enable-cuda-compat step gets ``args`` instead of the driver version."""
    config = node_config(tmp_path, sim_node, mode="cdi", runtime=RUNTIMES[runtime][0])
    spec = os.path.join(spec_dir(tmp_path), "nvidia.yaml")
    with open(spec) as f:
        text = f.read()
    text, n = re.subn(r'( *)- "--host-driver-version"\n *- "?[0-9.]+"?\n',
                      lambda m: "".join(f'{m.group(1)}- "{a}"\n' for a in args.split()), text)
    assert n >= 1, text
    with open(spec, "w") as f:
        f.write(text)
    return config


def _run_with(tmp_path, rootfs, config):
    """dlopen-probe through the shim under ``config`` (run_gpu would write the spec anew)."""
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["dlopen-probe", "libcuda.so.1"],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    return run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                               "PATH": os.environ.get("PATH", "/usr/bin:/bin")})


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("host_cuda, folder", [("12.4", COMPAT), ("12.9", HOST)])
def test_a_newer_cuda_version_in_the_note(tmp_path, sim_node, rootfs, runtime, host_cuda, folder):
    need_runtime(runtime)
    _image(sim_node, rootfs, {"Format": 1, "CUDA Version": "12.9", "Driver": [570, 575], "Device": [2, 14]})
    config = _cdi_spec_with(tmp_path, sim_node, runtime, f"--host-cuda-version={host_cuda}")
    out = _loaded(_run_with(tmp_path, rootfs, config))
    assert out == f"ok libcuda.so.1 {folder}/libcuda.so.1"


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("brands, folder", [("--gpu-brand=2", COMPAT), ("--gpu-brand=2 --gpu-brand=5", HOST)])
def test_the_device_list_of_the_note(tmp_path, sim_node, rootfs, runtime, brands, folder):
    need_runtime(runtime)
    _image(sim_node, rootfs, {"Format": 1, "CUDA Version": "12.9", "Driver": [550], "Device": [1, 2, 14]})
    version = sim_node["driver_version"]
    config = _cdi_spec_with(tmp_path, sim_node, runtime, f"--host-driver-version={version} {brands}")
    out = _loaded(_run_with(tmp_path, rootfs, config))
    assert out == f"ok libcuda.so.1 {folder}/libcuda.so.1"



@pytest.fixture(scope="module")
def mixed_node(tmp_path_factory):
    """A node whose GPU 0 is a brand the note lists and GPU 1 one it does not."""
    need_runtime("runc")  # root, for the node's device nodes
    return mixed_brands_node(tmp_path_factory)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
@pytest.mark.parametrize("visible, folder", [
    ("0", COMPAT),    # the H100 alone: its brand is listed
    ("1", HOST),      # the GeForce RTX alone: not listed (the note's list unused, it took compat: error 804)
    ("0,1", HOST),    # one GPU not listed is enough for CUDA to fail with 804
])
def test_the_device_list_by_the_container_gpus(tmp_path, mixed_node, rootfs, runtime, mode, visible, folder):
    """The container's own GPUs, by NVML (the node's mock), against the note's device list."""
    need_runtime(runtime)
    _image(mixed_node, rootfs, {"format": 1, "CUDA version": "12.9", "driver": [535, 550, 570, 575],
                                "device": NOTE_575["device"]})
    if mode == "cdi":
        visible = ",".join(f"nvidia.com/gpu={i}" for i in visible.split(","))
    out = _loaded(run_gpu(tmp_path, mixed_node, rootfs, mode=mode, runtime=runtime,
                          env=[f"NVIDIA_VISIBLE_DEVICES={visible}"], command="dlopen-probe libcuda.so.1"))
    assert out == f"ok libcuda.so.1 {folder}/libcuda.so.1"



@pytest.mark.parametrize("gpu, folder", [("0", COMPAT), ("1", HOST)])
def test_podman_applying_a_generated_spec(tmp_path, mixed_node, rootfs, gpu, folder):
    """A native CDI consumer (podman 4.3, crun): the spec's chain, shared by every device, finds the
    container's GPU by its /dev/nvidiaN node and NVML gives its brand."""
    from tests.support.fixtures import need_binaries
    from tests.support.image import build_image_tar
    from tests.support.podman import CDI_DIRS, PODMAN, Podman, cdi_spec, unique_cdi_vendor

    need_binaries(PODMAN)
    _image(mixed_node, rootfs, {"Format": 1, "CUDA Version": "12.9", "Driver": [550], "Device": NOTE_575["device"]})
    vendor = unique_cdi_vendor()
    generate_spec(tmp_path, mixed_node["config"], vendor)
    with open(os.path.join(spec_dir(tmp_path), "nvidia.yaml")) as f:
        text = f.read()
    tar = os.path.join(str(tmp_path), "image.tar")
    build_image_tar(rootfs, tar, "nvct/compat", "latest")
    with Podman() as podman, cdi_spec(text, directory=CDI_DIRS[1], suffix=".yaml"):
        podman.load(tar)
        result = podman.run(["--rm", "--device", f"{vendor}/gpu={gpu}", "docker.io/nvct/compat:latest",
                             "dlopen-probe", "libcuda.so.1"])
    assert result.rc == 0, result.describe()
    assert result.stdout.strip() == f"ok libcuda.so.1 {folder}/libcuda.so.1"
