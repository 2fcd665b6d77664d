"""GPU containers through the shim, under real runc and crun, in legacy and jit-cdi mode.

Every check runs inside the container: which /dev/nvidia* nodes exist, whether
the driver libraries dlopen by SONAME, what the simulated nvidia-smi sees.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import PATH_ENV, SHIM, expected_nodes, node_config
from tests.support.bundle import make_bundle
from tests.support.fixtures import skip
from tests.support.runtimes import run_container

pytestmark = pytest.mark.containers

MODES = ("legacy", "jit-cdi")
RUNTIMES = ("runc", "crun")
LIST_NODES = "find /dev -type c -name 'nvidia*' | sort"


def run_gpu(tmp_path, sim_node, rootfs, *, runtime, mode, env, command, privileged=False, state_root=None):
    config = node_config(tmp_path, sim_node, mode=mode, runtime=runtime)
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", command],
                         env=[PATH_ENV, *env], privileged=privileged)
    return run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                              "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                         root=state_root)


def nodes_in(result) -> set[str]:
    assert result.rc == 0, result.describe()
    return {line for line in result.stdout.splitlines() if line.startswith("/dev/")}


def _cases(manifest):
    gpu5 = manifest["gpus"][5]["uuid"]
    mig1 = manifest["gpus"][0]["mig_devices"][1]["uuid"]
    all_gpus = range(len(manifest["gpus"]))
    all_migs = [(0, 0), (0, 1)]
    return {
        "all": ("all", expected_nodes(manifest, all_gpus, all_migs)),
        "1,3": ("1,3", expected_nodes(manifest, [1, 3])),
        "gpu-uuid": (gpu5, expected_nodes(manifest, [5])),
        "mig-index": ("0:1", expected_nodes(manifest, migs=[(0, 1)])),
        "mig-uuid": (mig1, expected_nodes(manifest, migs=[(0, 1)])),
        "none": ("none", expected_nodes(manifest)),
        "void": ("void", set()),
    }


@pytest.mark.parametrize("case", ["all", "1,3", "gpu-uuid", "mig-index", "mig-uuid", "none", "void"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_exact_device_nodes(tmp_path, sim_node, rootfs, gpu_runtimes, runtime, mode, case):
    value, expected = _cases(sim_node)[case]
    result = run_gpu(tmp_path, sim_node, rootfs, runtime=runtime, mode=mode,
                     env=[f"NVIDIA_VISIBLE_DEVICES={value}"], command=LIST_NODES)
    assert nodes_in(result) == expected


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_libraries_load_by_soname_and_nvidia_smi_sees_only_visible_gpus(
        tmp_path, sim_node, rootfs, gpu_runtimes, runtime, mode):
    result = run_gpu(tmp_path, sim_node, rootfs, runtime=runtime, mode=mode,
                     env=["NVIDIA_VISIBLE_DEVICES=1,3"],
                     command="dlopen-probe libcuda.so.1 libnvidia-ml.so.1 && nvidia-smi -L")
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/")
    assert lines[1].startswith("ok libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/")
    uuids = [sim_node["gpus"][i]["uuid"] for i in (1, 3)]
    assert lines[2:] == [f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {u})" for n, u in enumerate(uuids)]


@pytest.mark.parametrize("mode", MODES)
def test_utility_capability_brings_no_libcuda(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    result = run_gpu(tmp_path, sim_node, rootfs, runtime="runc", mode=mode,
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
                     command="ls /usr/lib/x86_64-linux-gnu/; nvidia-smi -L")
    assert result.rc == 0, result.describe()
    assert "libcuda" not in result.stdout
    assert "libnvidia-ml.so.1" in result.stdout
    assert f"(UUID: {sim_node['gpus'][0]['uuid']})" in result.stdout


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_unsatisfiable_cuda_requirement_stops_the_container_and_leaves_nothing(
        tmp_path, sim_node, rootfs, gpu_runtimes, runtime, mode):
    state_root = str(tmp_path / "state")
    result = run_gpu(tmp_path, sim_node, rootfs, runtime=runtime, mode=mode,
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"],
                     command="echo started", state_root=state_root)
    assert result.rc != 0
    assert "started" not in result.stdout
    # crun shows only "error executing hook"; the hook's own line is then in nvct's log.
    log_file = tmp_path / "nvct.log"
    logged = log_file.read_text() if log_file.exists() else ""
    assert "unsatisfied condition: cuda>=99.0, please update your driver" in result.stderr + result.log + logged
    # No container state and no mount of the rootfs is left behind.
    assert not [d for d in os.listdir(state_root) if not d.startswith(".")] if os.path.isdir(state_root) else True
    with open("/proc/self/mountinfo") as f:
        assert rootfs not in f.read()


def test_satisfied_requirement_starts(tmp_path, sim_node, rootfs, gpu_runtimes):
    result = run_gpu(tmp_path, sim_node, rootfs, runtime="runc", mode="jit-cdi",
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0 brand=tesla,driver>=470"],
                     command="echo started")
    assert result.rc == 0, result.describe()
    assert result.stdout.strip() == "started"


@pytest.mark.parametrize("mode", MODES)
def test_device_cgroup_allows_exactly_the_injected_nodes(tmp_path, sim_node, rootfs, gpu_runtimes, mode):
    # cgroup v1 (this machine): jit-cdi has runc write the rules, legacy has the hook write devices.allow.
    if not os.path.exists("/sys/fs/cgroup/devices/devices.list"):
        skip("needs the cgroup v1 devices controller (this check reads devices.list)")
    uvm = sim_node["device_majors"]["nvidia-uvm"]
    result = run_gpu(tmp_path, sim_node, rootfs, runtime="runc", mode=mode, env=["NVIDIA_VISIBLE_DEVICES=1"],
                     command=f"grep -E '^c (195|{uvm}):' /sys/fs/cgroup/devices/devices.list")
    assert result.rc == 0, result.describe()
    assert set(result.stdout.split("\n")) - {""} == {
        "c 195:1 rwm", "c 195:255 rwm", "c 195:254 rwm", f"c {uvm}:0 rwm", f"c {uvm}:1 rwm"}


@pytest.mark.parametrize("mode", ("legacy", "jit-cdi", "cdi"))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_images_own_libcuda_links_are_replaced_by_the_drivers(tmp_path, sim_node, gpu_runtimes, runtime, mode):
    """As the reference's ``ln -sf``: a stub ``libcuda.so.1`` or a stale ``libcuda.so`` link in the image
    gives way to the driver's links instead of failing the start or shadowing the driver."""
    from tests.support.gpu_runs import run_gpu as run_in_mode
    from tests.support.rootfs import make_rootfs

    rootfs = make_rootfs(str(tmp_path), name="image-with-stub")
    libdir = os.path.join(rootfs, "usr/lib/x86_64-linux-gnu")
    os.makedirs(libdir, exist_ok=True)
    with open(os.path.join(libdir, "libcuda.so.1"), "w") as f:
        f.write("a stub the image shipped\n")
    os.symlink("/usr/local/cuda/lib64/stubs/libcuda.so", os.path.join(libdir, "libcuda.so"))
    result = run_in_mode(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                         command="cd /usr/lib/x86_64-linux-gnu && readlink libcuda.so.1 && readlink libcuda.so && "
                                 "dlopen-probe libcuda.so.1")
    assert result.rc == 0, result.describe()
    version = sim_node["driver_version"]
    assert result.stdout.splitlines()[:2] == [f"libcuda.so.{version}", "libcuda.so.1"], result.describe()
    assert result.stdout.splitlines()[2].startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/"), result.describe()
    # The rootfs is the container's writable layer: the link replaced the stub there, nowhere else.
    assert os.readlink(os.path.join(libdir, "libcuda.so.1")) == f"libcuda.so.{version}"


@pytest.mark.parametrize("mode", ("legacy", "jit-cdi", "cdi"))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_driver_wins_over_a_stub_the_images_own_cache_resolves(tmp_path, sim_node, gpu_runtimes, runtime,
                                                                   mode):
    """The image's ld cache maps ``libcuda.so.1`` to its own stub (a folder its ld.so.conf lists): the
    container's loader must find the driver's. nvct patches that cache rather than run ldconfig."""
    import shutil
    import subprocess

    from tests.support.gpu_runs import run_gpu as run_in_mode
    from tests.support.rootfs import make_rootfs, refresh_ld_cache

    if shutil.which("gcc") is None:
        skip("needs gcc (builds the image's stub libcuda.so.1)")
    rootfs = make_rootfs(str(tmp_path), name="image-with-cached-stub")
    os.makedirs(os.path.join(rootfs, "opt/stub"))
    source = tmp_path / "stub.c"
    source.write_text("int cuInit(unsigned int flags) { return 999; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                    os.path.join(rootfs, "opt/stub/libcuda.so.1"), str(source)], check=True)
    with open(os.path.join(rootfs, "etc/ld.so.conf"), "a") as f:
        f.write("/opt/stub\n")
    refresh_ld_cache(rootfs)
    result = run_in_mode(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                         command="dlopen-probe libcuda.so.1")
    assert result.rc == 0, result.describe()
    assert result.stdout.startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/"), result.describe()
