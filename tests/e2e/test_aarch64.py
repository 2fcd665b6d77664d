"""arm64 (Grace, sbsa) GPU containers on the simulated aarch64 node, through real runc and crun under qemu.

The node (``nvct simulate node --arch aarch64``: a GH200) has cross-compiled
driver libraries and an ld cache written by Debian arm64's ldconfig; the
image is Debian's arm64 packages. Everything in the container runs as arm64
code under qemu-user-static (binfmt_misc, flag F): the device nodes, the
driver libraries loaded by SONAME, the mock nvidia-smi, and the container's
ld cache after nvct's patch, byte for byte what arm64 ldconfig writes.
"""

from __future__ import annotations

import os

import pytest

from tests.support import arm64
from tests.support.bundle import add_hook, make_bundle
from tests.support.fixtures import skip
from tests.support.gpu_runs import PATH_ENV, VENV_BIN, need_runtime, node_config, run_gpu
from tests.support.runtimes import run_container

pytestmark = pytest.mark.containers

LIBDIR = "/usr/lib/aarch64-linux-gnu"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
CHECK = ("find /dev -type c -name 'nvidia*' | sort; "
         "dlopen-probe libcuda.so.1 libnvidia-ml.so.1 && nvidia-smi -L && "
         "ls -d /usr/lib/x86_64-linux-gnu /usr/lib/i386-linux-gnu 2>&1 | sed 's/^/other-arch /'")
# The patched cache as `ldconfig -p` lists it, then the same for the cache arm64 ldconfig writes from
# scratch for the same files (no links made; the first line names the file).
LDCONFIG = ("ldconfig -p | sed 1d > /tmp/patched && cat /tmp/patched && ldconfig -X -C /tmp/fresh "
            "&& ldconfig -p -C /tmp/fresh | sed 1d > /tmp/fresh.txt && cmp /tmp/patched /tmp/fresh.txt && echo same")


@pytest.fixture(scope="session")
def grace_node(tmp_path_factory):
    if os.geteuid() != 0:
        skip("needs root (builds a simulated GPU node with mknod, registers binfmt_misc)")
    return arm64.grace_node(tmp_path_factory.getbasetemp() / "sim")


@pytest.fixture
def arm64_rootfs(tmp_path):
    need_runtime("runc")
    return arm64.make_rootfs(tmp_path)


def _cli() -> str:
    """The node's ldconfig is arm64's, as on a Grace host.

    Only the patch is exercised here: the fallback runs ldconfig from an fd,
    and the kernel refuses (ENOENT) a binfmt_misc interpreter for a
    close-on-exec fd's file, so qemu cannot run it on this machine.
    """
    return f'ldconfig = "@{arm64.ldconfig()}"'


def _check(result, node) -> list[str]:
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert {ln for ln in lines if ln.startswith("/dev/")} == CONTROL | {"/dev/nvidia0"}
    rest = [ln for ln in lines if not ln.startswith("/dev/")]
    assert rest[0].startswith(f"ok libcuda.so.1 {LIBDIR}/libcuda.so."), rest
    assert rest[1].startswith(f"ok libnvidia-ml.so.1 {LIBDIR}/libnvidia-ml.so."), rest
    gpu = node["gpus"][0]
    assert rest[2] == f"GPU 0: NVIDIA GH200 480GB (UUID: {gpu['uuid']})"
    assert all("No such file" in ln for ln in rest[3:]) and len(rest) == 5, rest  # no x86 or i386 folders
    return lines


def test_the_node_is_arm64_with_no_32_bit_libraries(grace_node):
    assert grace_node["arch"] == "aarch64"
    assert {lib["arch"] for lib in grace_node["libraries"]} == {"aarch64"}
    assert all(lib["path"].startswith(LIBDIR + "/") for lib in grace_node["libraries"])
    with open(os.path.join(grace_node["roots"]["driver_root"], LIBDIR.lstrip("/"), "libcuda.so.1"), "rb") as f:
        head = f.read(20)
    assert head[:5] == b"\x7fELF\x02" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_arm64_container_gets_the_gpu_through_the_shim(tmp_path, grace_node, arm64_rootfs, runtime, mode):
    need_runtime(runtime)
    result = run_gpu(tmp_path, grace_node, arm64_rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=all"], command=CHECK, cli_config=_cli(), timeout=120)
    _check(result, grace_node)


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_the_patched_ld_cache_is_what_arm64_ldconfig_writes(tmp_path, grace_node, arm64_rootfs, mode):
    result = run_gpu(tmp_path, grace_node, arm64_rootfs, mode=mode, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command=LDCONFIG, cli_config=_cli(), timeout=120)
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert lines[-1] == "same"
    listed = [ln.strip() for ln in lines if " => " in ln]
    assert f"libcuda.so.1 (libc6,AArch64) => {LIBDIR}/libcuda.so.1" in listed
    assert f"libnvidia-ml.so.1 (libc6,AArch64) => {LIBDIR}/libnvidia-ml.so.1" in listed
    assert all("(libc6,AArch64)" in ln for ln in listed), listed
    with open(os.path.join(str(tmp_path), "nvct.log")) as f:
        assert "left to ldconfig" not in f.read()  # nvct's patch, not the fallback


def test_arm64_container_through_the_hook_as_docker_gpus_runs_it(tmp_path, grace_node, arm64_rootfs):
    config = node_config(tmp_path, grace_node, mode="legacy", cli=_cli())
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), arm64_rootfs, ["sh", "-c", CHECK],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=all"])
    add_hook(bundle, "prestart", os.path.join(VENV_BIN, "nvidia-container-runtime-hook"),
             ["nvidia-container-runtime-hook", "prestart"],
             env=[f"NVIDIA_CTK_CONFIG_FILE_PATH={config}", "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"])
    result = run_container(["/usr/sbin/runc"], bundle, timeout=120)
    _check(result, grace_node)
