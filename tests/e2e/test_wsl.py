"""WSL2 GPU containers on the simulated WSL2 node, through the shim and real runc and crun, and podman.

The node (``nvct simulate node --platform wsl``) has ``/dev/dxg`` (mknod) and
a driver store of real ELF files beside another vendor's and WSL's own
``/usr/lib/wsl/lib``; no NVIDIA module, no ``/dev/nvidia*``. A container must
get ``/dev/dxg``, each listed driver-store file byte for byte at its node
path, ``/usr/bin/nvidia-smi`` linked to the store's, the libraries loadable by
SONAME through the ld cache, and nothing else of the node.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from nvct.cdi import spec as spec_mod
from tests.e2e.conftest import VENV_BIN
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, private_podman, skip  # noqa: F401 - fixtures
from tests.support.gpu_runs import assert_untouched, host_victim, need_runtime, refusal, run_gpu
from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor

pytestmark = pytest.mark.containers

NVCT = os.path.join(VENV_BIN, "nvct")


@pytest.fixture(scope="module")
def wsl_node(tmp_path_factory):
    if os.geteuid() != 0:
        skip("needs root (mknod /dev/dxg)")
    from nvct.simulate.wsl import build_wsl_node

    return build_wsl_node(tmp_path_factory.mktemp("wsl") / "node")


def _check_script(node) -> str:
    files = " ".join(sorted(node["injected"]))
    others = " ".join(node["not_injected"])
    return (f"stat -c 'dxg %t:%T %F' /dev/dxg; ls /dev | grep -c nvidia; sha256sum {files}; "
            f"for f in {others}; do test -e $f && echo LEAK $f; done; "
            f"ls /usr/lib/wsl/drivers | sed 's/^/store /'; "
            "readlink /usr/bin/nvidia-smi; nvidia-smi -L; "
            "command -v dlopen-probe >/dev/null && dlopen-probe libcuda.so.1 libnvidia-ml.so.1 libdxcore.so; true")


def _assert_sees(result, node, *, probe: bool = True) -> None:
    assert result.rc == 0, result.describe()
    out = result.stdout.splitlines()
    major, minor = node["dxg"]
    assert out[0] == f"dxg {major:x}:{minor:x} character special file", result.describe()
    assert out[1] == "0", result.describe()  # no /dev/nvidia*
    sums = {ln.split()[1]: ln.split()[0] for ln in out if len(ln.split()) == 2 and ln.split()[1].startswith("/usr/")}
    assert sums == node["injected"], result.describe()
    assert not [ln for ln in out if ln.startswith("LEAK")], result.describe()
    assert [ln for ln in out if ln.startswith("store ")] == ["store " + os.path.basename(node["driver_store"])]
    smi = node["driver_store"] + "/nvidia-smi"
    assert smi in out, result.describe()
    gpu = node["gpus"][0]
    assert f"GPU 0: {gpu['model']} (UUID: {gpu['uuid']})" in out, result.describe()
    if probe:
        store = node["driver_store"]
        assert f"ok libcuda.so.1 {store}/libcuda.so.1" in out, result.describe()
        assert f"ok libnvidia-ml.so.1 {store}/libnvidia-ml.so.1" in out, result.describe()
        assert "ok libdxcore.so /usr/lib/wsl/lib/libdxcore.so" in out, result.describe()


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi", "legacy"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_wsl_container_gets_dxg_and_the_driver_store(tmp_path, wsl_node, rootfs, runtime, mode):
    need_runtime(runtime)
    result = run_gpu(tmp_path, wsl_node, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=all"], command=_check_script(wsl_node))
    _assert_sees(result, wsl_node)


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_a_gpu_index_on_wsl_gets_every_gpu(tmp_path, wsl_node, rootfs, mode):
    """As the reference: every GPU is behind /dev/dxg, so a container naming GPU 0 gets it too."""
    need_runtime("runc")
    result = run_gpu(tmp_path, wsl_node, rootfs, mode=mode, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command=_check_script(wsl_node))
    _assert_sees(result, wsl_node)


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_a_cuda_image_starts_on_wsl(tmp_path, wsl_node, rootfs, mode):
    """A CUDA image's NVIDIA_REQUIRE_CUDA cannot be checked on WSL2: said in the log, not a failed start."""
    need_runtime("runc")
    result = run_gpu(tmp_path, wsl_node, rootfs, mode=mode, command=_check_script(wsl_node),
                     env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla,driver>=470"])
    _assert_sees(result, wsl_node)
    with open(os.path.join(str(tmp_path), "nvct.log")) as f:
        assert "WSL2: NVIDIA_REQUIRE_* not checked" in f.read()


def test_no_gpu_request_on_wsl_gets_nothing(tmp_path, wsl_node, rootfs):
    need_runtime("runc")
    result = run_gpu(tmp_path, wsl_node, rootfs, mode="jit-cdi", command="ls /dev/dxg /usr/lib/wsl 2>&1; true")
    assert result.rc == 0 and result.stdout.count("No such file") == 2, result.describe()


def test_a_wsl_node_has_one_device_all(tmp_path, wsl_node):
    proc = _generate(wsl_node, "nvidia.com", "--device-id", "0")
    assert proc.returncode != 0 and "a WSL2 node has one device, all" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _generate(node, vendor, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    return subprocess.run([NVCT, "cdi", "generate", "--hook-path", NVCT, "--vendor", vendor, *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("args", [("--mode", "wsl"), ()])
def test_cdi_generate_wsl_is_a_valid_spec(wsl_node, args):
    """``--mode wsl``, and ``auto`` finding /dev/dxg: one device ``all``, valid against the schema."""
    proc = _generate(wsl_node, "nvidia.com", *args)
    assert proc.returncode == 0, proc.stderr
    raw = yaml.safe_load(proc.stdout)
    spec_mod.validate(raw)
    assert [d["name"] for d in raw["devices"]] == ["all"]
    assert [n["path"] for n in raw["devices"][0]["containerEdits"]["deviceNodes"]] == ["/dev/dxg"]
    mounted = {m["containerPath"] for m in raw["containerEdits"]["mounts"]}
    assert mounted == set(wsl_node["injected"])


def test_podman_runs_the_wsl_spec(private_podman, wsl_node):
    vendor = unique_cdi_vendor()
    proc = _generate(wsl_node, vendor, "--mode", "wsl")
    assert proc.returncode == 0, proc.stderr
    with cdi_spec(proc.stdout, directory=CDI_DIRS[1], suffix=".yaml"):
        result = private_podman.run(["--rm", "--device", f"{vendor}/gpu=all", BUSYBOX_IMAGE_QUALIFIED,
                                     "sh", "-c", _check_script(wsl_node)])
    _assert_sees(result, wsl_node, probe=False)  # busybox: no glibc to dlopen with


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_image_link_at_nvidia_smi_is_never_followed(tmp_path, wsl_node, rootfs, runtime):
    """The image's own /usr/bin/nvidia-smi, a link to a host file: replaced by the store's link, never followed."""
    need_runtime(runtime)
    outside, victim = host_victim(tmp_path)
    os.makedirs(os.path.join(rootfs, "usr/bin"), exist_ok=True)
    link = os.path.join(rootfs, "usr/bin/nvidia-smi")
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(victim, link)
    result = run_gpu(tmp_path, wsl_node, rootfs, mode="jit-cdi", runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command="readlink /usr/bin/nvidia-smi")
    assert_untouched(outside, victim)
    assert result.rc == 0 and result.stdout.split() == [wsl_node["driver_store"] + "/nvidia-smi"], \
        result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_image_wsl_folder_linked_out_of_the_root_reaches_nothing_on_the_host(tmp_path, wsl_node, rootfs,
                                                                               runtime):
    need_runtime(runtime)
    outside, victim = host_victim(tmp_path)
    os.makedirs(os.path.join(rootfs, "usr/lib"), exist_ok=True)
    os.symlink(outside, os.path.join(rootfs, "usr/lib/wsl"))
    result = run_gpu(tmp_path, wsl_node, rootfs, mode="jit-cdi", runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command="ls /usr/lib/wsl/lib; true")
    assert_untouched(outside, victim)
    if result.rc != 0:
        assert "/usr/lib/wsl" in refusal(result, tmp_path)
