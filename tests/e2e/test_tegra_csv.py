"""Jetson csv mode: arm64 containers on the simulated Tegra board, through the shim and real runc and crun.

The board (``nvct simulate node --platform tegra``) has cross-compiled arm64
libraries, L4T's links, ``/dev/nvhost-*`` and ``/dev/nvmap``, and CSV lists
that name some of them; the rest of the board must stay out. The image is
Debian's arm64 packages, run under qemu-user-static (binfmt_misc, flag F).
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from nvct.cdi import spec as spec_mod
from tests.e2e.conftest import VENV_BIN
from tests.support import arm64
from tests.support.fixtures import skip
from tests.support.gpu_runs import assert_untouched, host_victim, need_runtime, refusal, run_gpu

pytestmark = pytest.mark.containers

NVCT = os.path.join(VENV_BIN, "nvct")

LIBDIR = "/usr/lib/aarch64-linux-gnu/nvidia"
#: What the container's LIBDIR holds: the listed files and links, and the SONAME links ldconfig would make.
LIBDIR_NAMES = {"libcuda.so.1.1", "libcuda.so", "libcuda.so.1", "libnvrm_gpu.so", "libnvrm_mem.so",
                "libnvidia-ptxjitcompiler.so.540.4.0", "libnvidia-ptxjitcompiler.so.1"}
_STANDARD = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom", "/dev/console",
             "/dev/ptmx", "/dev/pts/")


@pytest.fixture(scope="module")
def tegra_node(tmp_path_factory):
    if os.geteuid() != 0:
        skip("needs root (mknod, binfmt_misc)")
    arm64.ensure_binfmt()
    from nvct.simulate.tegra import build_tegra_node

    return build_tegra_node(tmp_path_factory.mktemp("tegra") / "board")


@pytest.fixture
def arm64_rootfs(tmp_path):
    need_runtime("runc")
    return arm64.make_rootfs(tmp_path)


def _script(node) -> str:
    files = " ".join(sorted(node["files"]))
    links = " ".join(sorted(node["links"]))
    others = " ".join([*node["not_injected"], *node["all_mounts_only"]])
    return (f"find /dev -type c | sort | sed 's/^/dev /'; sha256sum {files}; "
            f"for l in {links}; do echo \"link $l $(readlink $l)\"; done; "
            f"for f in {others}; do test -e $f && echo LEAK $f; done; "
            f"ls -A {LIBDIR} | sed 's/^/libdir /'; dlopen-probe libcuda.so.1 libnvrm_gpu.so; true")


def _assert_sees(result, node, *, extra: bool = False) -> None:
    assert result.rc == 0, result.describe()
    out = result.stdout.splitlines()
    devs = {ln[4:] for ln in out if ln.startswith("dev ") and not ln[4:].startswith(_STANDARD)}
    assert devs == set(node["devices"]), result.describe()
    sums = {ln.split()[1]: ln.split()[0] for ln in out if len(ln.split()) == 2 and len(ln.split()[0]) == 64}
    assert sums == node["files"], result.describe()
    links = {ln.split()[1]: ln.split()[2] for ln in out if ln.startswith("link ") and len(ln.split()) == 3}
    assert links == node["links"], result.describe()
    leaks = {ln.split()[1] for ln in out if ln.startswith("LEAK ")}
    assert leaks == (set(node["all_mounts_only"]) if extra else set()), result.describe()
    names = {ln.split()[1] for ln in out if ln.startswith("libdir ")}
    assert names == LIBDIR_NAMES | ({"libnvcudla.so"} if extra else set()), result.describe()
    assert f"ok libcuda.so.1 {LIBDIR}/libcuda.so.1" in out, result.describe()
    assert f"ok libnvrm_gpu.so {LIBDIR}/libnvrm_gpu.so" in out, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_csv_container_sees_every_listed_file_and_node_and_nothing_more(tmp_path, tegra_node, arm64_rootfs,
                                                                        runtime):
    need_runtime(runtime)
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="csv", runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=all"], command=_script(tegra_node), timeout=120)
    _assert_sees(result, tegra_node)


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy", "auto"])
def test_every_mode_on_a_jetson_gives_the_csv_lists(tmp_path, tegra_node, arm64_rootfs, mode):
    """On a Tegra board the other modes (legacy: the hook, as docker --gpus runs it) give the same container,
    and a CUDA image's NVIDIA_REQUIRE_CUDA is said unchecked in the log, not a failed start."""
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode=mode, timeout=120, command=_script(tegra_node),
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.2"])
    _assert_sees(result, tegra_node)
    with open(os.path.join(str(tmp_path), "nvct.log")) as f:
        assert "Tegra: NVIDIA_REQUIRE_* not checked" in f.read()


def test_csv_mounts_all_reads_every_list(tmp_path, tegra_node, arm64_rootfs):
    """``NVIDIA_REQUIRE_JETPACK=csv-mounts=all``: the lists beyond devices, drivers and l4t too."""
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="csv", timeout=120, command=_script(tegra_node),
                     env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_JETPACK=csv-mounts=all"])
    _assert_sees(result, tegra_node, extra=True)


def test_no_gpu_request_gets_nothing_in_csv_mode(tmp_path, tegra_node, arm64_rootfs):
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="csv", timeout=120,
                     command=f"ls /dev/nvmap {LIBDIR} 2>&1; true")
    assert result.rc == 0 and result.stdout.count("No such file") == 2, result.describe()


@pytest.mark.parametrize("inside_too", [False, True], ids=["leads-nowhere-inside", "leads-inside"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_image_folder_linked_out_of_the_root_is_confined(tmp_path, tegra_node, arm64_rootfs, runtime,
                                                            inside_too):
    """The image makes the libraries' folder a link to a host path: nothing reaches the host.

    Resolved in the container's root, the link leads to the root's own copy of that path: where
    the image has that folder too, the files land there; where not, the start is refused.
    """
    need_runtime(runtime)
    outside, victim = host_victim(tmp_path)
    folder = os.path.join(arm64_rootfs, LIBDIR.lstrip("/"))
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    os.symlink(outside, folder)
    if inside_too:
        os.makedirs(os.path.join(arm64_rootfs, outside.lstrip("/")))
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="csv", runtime=runtime, timeout=120,
                     env=["NVIDIA_VISIBLE_DEVICES=all"], command=f"ls -A {LIBDIR}; true")
    assert_untouched(outside, victim)
    if inside_too:  # confined: the mounts and links landed inside the root, where the link leads there
        assert result.rc == 0 and "libcuda.so.1.1" in result.stdout.split(), result.describe()
        assert "libcuda.so" in os.listdir(os.path.join(arm64_rootfs, outside.lstrip("/")))
    else:  # refused, naming the path (today: the link leads nowhere inside the root)
        assert LIBDIR in refusal(result, tmp_path)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_image_link_at_a_csv_symlink_target_is_never_followed(tmp_path, tegra_node, arm64_rootfs, runtime):
    """The image puts its own link at a ``sym`` entry's path, aimed at a host file: it is replaced or refused."""
    need_runtime(runtime)
    outside, victim = host_victim(tmp_path)
    link = os.path.join(arm64_rootfs, "usr/lib/aarch64-linux-gnu/libcuda.so")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(victim, link)
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="csv", runtime=runtime, timeout=120,
                     env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command="readlink /usr/lib/aarch64-linux-gnu/libcuda.so; true")
    assert_untouched(outside, victim)
    if result.rc == 0:  # replaced by the board's link, inside the root
        assert result.stdout.split() == ["nvidia/libcuda.so"], result.describe()
    else:
        assert "libcuda.so" in refusal(result, tmp_path)


def _generate(node, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    return subprocess.run([NVCT, "cdi", "generate", "--hook-path", NVCT, *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("args", [("--mode", "csv"), ()], ids=["csv", "auto"])
def test_cdi_generate_csv_is_a_valid_spec_of_the_lists(tegra_node, args):
    """``--mode csv``, and ``auto`` on a Tegra board: one device ``all`` with the listed nodes, valid CDI."""
    proc = _generate(tegra_node, *args)
    assert proc.returncode == 0, proc.stderr
    raw = yaml.safe_load(proc.stdout)
    spec_mod.validate(raw)
    assert [d["name"] for d in raw["devices"]] == ["all"]
    nodes = {n["path"] for n in raw["devices"][0]["containerEdits"]["deviceNodes"]}
    assert nodes == set(tegra_node["devices"])
    mounted = {m["containerPath"] for m in raw["containerEdits"]["mounts"]}
    assert mounted == set(tegra_node["files"]) - {f for f in tegra_node["files"] if f.startswith("/lib/firmware/")} \
        | set(tegra_node["directories"])


def test_the_generated_csv_spec_runs_through_cdi_mode(tmp_path, tegra_node, arm64_rootfs):
    """The spec ``cdi generate`` writes on the board, resolved by the shim's cdi mode: the same container."""
    result = run_gpu(tmp_path, tegra_node, arm64_rootfs, mode="cdi", timeout=120, command=_script(tegra_node),
                     env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"])
    _assert_sees(result, tegra_node)
