"""Doctor on WSL2 and Jetson/Tegra nodes: no false failure, and each fault's verdict is a real container's.

The driver, devices and libraries checks look for NVIDIA's kernel module,
which neither platform has: there they say they do not apply, and the
``platform.*`` checks look at what containers get instead. Each fault is
checked against a container started through the shim and runc (arm64 under
qemu on the Tegra board).
"""

from __future__ import annotations

import os

import pytest

from tests.support import arm64
from tests.support.fixtures import skip
from tests.support.gpu_runs import need_runtime, node_config, run_gpu

pytestmark = pytest.mark.containers

CUDA = "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1"
NOT_APPLICABLE = ("driver.", "devices.", "libraries.")


def _doctor(tmp_path, node, mode: str) -> dict:
    """Doctor's findings by id, with the config the container runs under."""
    from nvct import doctor

    os.makedirs(tmp_path, exist_ok=True)
    config = node_config(tmp_path, node, mode=mode)
    missing = os.path.join(str(tmp_path), "absent")
    findings = doctor.run(doctor.Options(config_path=config, docker_config=missing, docker_socket=missing,
                                         docker_pidfile=missing, containerd_config=missing, crio_dir=missing,
                                         cdi_dirs=(missing,), toolkit_dirs=(missing,), env={}))
    return {f.id: f for f in findings}


def _no_false_failure(found: dict, platform: str) -> None:
    assert not [f for f in found.values() if f.status == "fail"], found
    skipped = [f for i, f in found.items() if i.startswith(NOT_APPLICABLE)]
    assert skipped and all(f.status == "info" and f.seen.startswith(f"not applicable on {platform}")
                           for f in skipped), skipped


@pytest.fixture
def tegra(tmp_path):
    if os.geteuid() != 0:
        skip("needs root (mknod, binfmt_misc)")
    need_runtime("runc")
    arm64.ensure_binfmt()
    from nvct.simulate.tegra import build_tegra_node

    return build_tegra_node(tmp_path / "board")


@pytest.fixture
def wsl(tmp_path):
    if os.geteuid() != 0:
        skip("needs root (mknod /dev/dxg)")
    need_runtime("runc")
    from nvct.simulate.wsl import build_wsl_node

    return build_wsl_node(tmp_path / "node")


def test_a_server_node_gets_no_platform_finding(node):
    found = node.doctor()
    assert not [f for f in found if f.id.startswith("platform.") or "not applicable" in f.seen], found


def test_tegra_board_passes_and_a_deleted_csv_listed_libcuda_fails_as_its_container_does(tmp_path, tegra):
    board = tegra
    image = arm64.make_rootfs(tmp_path)  # each run its own: runc leaves its mount points in the image
    found = _doctor(tmp_path / "ok", board, "csv")
    _no_false_failure(found, "Tegra")
    assert found["platform.csv-files"].status == "ok"
    # The board lists a library it lacks (as real L4T lists do): containers start without it.
    assert found["platform.csv-entries"].status == "warn" and "libmissing.so" in found["platform.csv-entries"].seen
    probe = "dlopen-probe libcuda.so.1; true"
    result = run_gpu(tmp_path / "ok", board, image, mode="csv", env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command=probe, timeout=120)
    assert result.rc == 0 and "ok libcuda.so.1" in result.stdout, result.describe()

    os.unlink(os.path.join(board["roots"]["driver_root"], CUDA.lstrip("/")))
    found = _doctor(tmp_path / "broken", board, "csv")
    entries = found["platform.csv-entries"]
    assert entries.status == "fail" and f"lib {CUDA}: not found" in entries.seen, entries
    image = arm64.make_rootfs(tmp_path, "rootfs-arm64-2")
    result = run_gpu(tmp_path / "broken", board, image, mode="csv", env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command=f"test -e {CUDA} && echo HAS-CUDA; {probe}", timeout=120)
    assert result.rc == 0, result.describe()
    assert "HAS-CUDA" not in result.stdout and "ok libcuda.so.1" not in result.stdout, result.describe()


def test_wsl_node_passes_and_a_missing_dxg_fails_as_its_container_does(tmp_path, wsl, rootfs):
    """On a WSL2 node whose /dev/dxg is gone nvct finds no driver: doctor names the device, and the start fails."""
    found = _doctor(tmp_path / "ok", wsl, "jit-cdi")
    _no_false_failure(found, "WSL2")
    assert found["platform.dxg"].status == "ok" and found["platform.driver-store"].status == "ok", found
    result = run_gpu(tmp_path / "ok", wsl, rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command="test -c /dev/dxg && echo DXG")
    assert result.rc == 0 and "DXG" in result.stdout, result.describe()

    os.unlink(os.path.join(wsl["roots"]["dev_root"], "dev/dxg"))
    found = _doctor(tmp_path / "broken", wsl, "jit-cdi")
    dxg = found["platform.dxg"]
    assert dxg.status == "fail" and "dev/dxg: No such file or directory" in dxg.seen, dxg
    assert found["driver.module"].status == "info", found  # named once, as the dxg device, not as a module
    result = run_gpu(tmp_path / "broken", wsl, rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=all"],
                     command="test -c /dev/dxg && echo DXG")
    assert not result.ok and "Traceback" not in result.stderr, result.describe()


@pytest.mark.parametrize("platform", ["wsl", "tegra"])
def test_nvidia_container_cli_on_a_platform_node(tmp_path, platform, request):
    """``list`` gives the host paths a GPU container gets there; ``info`` (module and NVML facts) says in one
    line why it has nothing to report."""
    import subprocess

    from tests.e2e.conftest import VENV_BIN

    node = request.getfixturevalue(platform)
    env = {**os.environ, "NVIDIA_CTK_CONFIG_FILE_PATH": node["config"]}
    cli = os.path.join(VENV_BIN, "nvidia-container-cli")
    info = subprocess.run([cli, "info"], capture_output=True, text=True, env=env, timeout=60)
    assert info.returncode == 1 and info.stderr.count("\n") == 1, info
    assert "has no NVIDIA kernel module or NVML" in info.stderr and "Traceback" not in info.stderr, info
    listed = subprocess.run([cli, "list"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed
    root = node["roots"]["driver_root"]
    if platform == "wsl":
        want = ["/dev/dxg", *node["injected"]]
    else:
        inside = tuple(d + "/" for d in node["directories"])  # a listed dir is one mount
        want = [*node["devices"], *node["directories"],
                *(f for f in node["files"] if not f.startswith(("/sys/", *inside)))]
    assert sorted(listed.stdout.split()) == sorted(root + p for p in want), listed.stdout


@pytest.mark.parametrize("platform", ["wsl", "tegra"])
def test_explain_on_a_platform_node_shows_the_platform_edits(platform, request):
    import subprocess

    from tests.e2e.conftest import VENV_BIN

    node = request.getfixturevalue(platform)
    env = {**os.environ, "NVIDIA_CTK_CONFIG_FILE_PATH": node["config"]}
    out = subprocess.run([os.path.join(VENV_BIN, "nvct"), "explain", "-e", "NVIDIA_VISIBLE_DEVICES=all"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out
    want = ["/dev/dxg", *node["injected"]] if platform == "wsl" else [*node["devices"], CUDA]
    assert all(f"    {p} " in out.stdout for p in want), out.stdout
