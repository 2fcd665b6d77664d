"""``nvidia-cdi-hook`` and ``nvidia-ctk``: the reference's hook names, flags and verbs, run as installed."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest

from tests.e2e.conftest import VENV_BIN
from tests.support.fixtures import skip

CDI_HOOK = os.path.join(VENV_BIN, "nvidia-cdi-hook")
CTK = os.path.join(VENV_BIN, "nvidia-ctk")
ENV = {"PATH": "/usr/bin:/bin"}


def run(argv, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=ENV, check=False)


@pytest.fixture
def container_root(tmp_path):
    if os.geteuid() != 0:
        skip("needs root (mknod)")
    root = tmp_path / "rootfs"
    (root / "dev").mkdir(parents=True)
    for minor in (1, 3):
        os.mknod(root / "dev" / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
    os.mknod(root / "dev" / "nvidiactl", stat.S_IFCHR | 0o666, os.makedev(195, 255))
    (root / "dev" / "nvidia7").write_text("not a device")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"ociVersion": "1.0", "id": "x", "pid": 0, "root": str(root)}))
    return root, state


@pytest.mark.parametrize("program", [[CDI_HOOK], [CTK, "hook"]])
def test_update_application_profile_masks_the_containers_gpus(container_root, program):
    root, state = container_root
    proc = run([*program, "update-application-profile", f"--container-spec={state}"])
    assert proc.returncode == 0, proc.stderr
    profile = root / "etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
    # the driver's profile syntax (a hex number, as the reference writes it), GPUs 1 and 3
    assert profile.read_text() == ('{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0xa]}],'
                                   '"rules":[{"pattern":[],"profile":"_container_"}]}')
    assert stat.S_IMODE(profile.stat().st_mode) == 0o444
    assert stat.S_IMODE(profile.parent.stat().st_mode) == 0o555


def test_hooks_read_the_state_on_stdin_and_unknown_ones_warn(container_root):
    root, state = container_root
    proc = run([CDI_HOOK, "--debug", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"],
               stdin=state.read_text())
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(root / "usr/lib/libcuda.so") == "libcuda.so.1"
    proc = run([CDI_HOOK, "chmod", "--mode", "755", "--path", "/dev"], stdin=state.read_text())
    assert proc.returncode == 0 and stat.S_IMODE(os.stat(root / "dev").st_mode) == 0o755
    unknown = run([CDI_HOOK, "apply-something-new", "--flag", "x"], stdin=state.read_text())
    assert unknown.returncode == 0 and "unknown hook 'apply-something-new'" in unknown.stderr


def test_versions_and_help():
    for argv, first in (([CDI_HOOK, "--version"], "NVIDIA CDI Hook version "),
                        ([CTK, "--version"], "NVIDIA Container Toolkit CLI version ")):
        proc = run(argv)
        assert proc.returncode == 0 and proc.stdout.startswith(first), proc
        assert "\ncommit: nvct " in proc.stdout
    listing = run([CDI_HOOK, "--help"]).stdout
    for name in ("create-symlinks", "update-ldcache", "enable-cuda-compat", "disable-device-node-modification",
                 "chmod", "update-application-profile"):
        assert name in listing


def test_ctk_verbs_are_nvcts(tmp_path):
    config = tmp_path / "config.toml"
    proc = run([CTK, "config", "default", "--output", str(config)])
    assert proc.returncode == 0, proc.stderr
    proc = run([CTK, "config", "--config-file", str(config), "--in-place", "--set",
                "nvidia-container-runtime.log-level=debug"])
    assert proc.returncode == 0, proc.stderr
    assert 'log-level = "debug"' in config.read_text()
    daemon = tmp_path / "daemon.json"
    proc = run([CTK, "runtime", "configure", "--runtime=docker", f"--config={daemon}"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(daemon.read_text())["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    for verb in (["cdi", "--help"], ["system", "--help"], ["hook", "--help"]):
        assert run([CTK, *verb]).returncode == 0, verb


@pytest.mark.parametrize("program", [[CDI_HOOK, "hook"], [CTK, "hook"]])
def test_nvcts_own_chain_runs_when_cdi_generate_named_these_programs(container_root, program):
    """Specs from earlier nvct versions give ``P`` the args ``nvct hook chain ...``: the
    program sees ``hook chain ...`` (nvidia-cdi-hook) or ``chain ...`` (after nvidia-ctk's ``hook``)."""
    root, state = container_root
    proc = run([*program, "chain", "create-symlinks", "--link", "a::/x/b", "--", "chmod", "--mode", "755",
                "--path", "/dev"], stdin=state.read_text())
    assert (proc.returncode, proc.stderr) == (0, "")
    assert os.readlink(root / "x/b") == "a" and stat.S_IMODE(os.stat(root / "dev").st_mode) == 0o755


def test_update_application_profile_on_a_read_only_etc_nvidia_warns_and_lets_the_start_go_on(container_root):
    """A ConfigMap mounted read-only at /etc/nvidia (the device plugin's) must not stop the container."""
    root, state = container_root
    (root / "etc/nvidia").mkdir(parents=True)
    (root / "etc/nvidia/config.yaml").write_text("version: v1\n")
    script = (f'mount --bind "{root}/etc/nvidia" "{root}/etc/nvidia" && '
              f'mount -o remount,bind,ro "{root}/etc/nvidia" && '
              f'exec "{CDI_HOOK}" update-application-profile --container-spec="{state}"')
    proc = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("update-application-profile: /etc/nvidia is read-only in the container; "
                           "EGL and Vulkan are not limited to its GPUs\n")
    assert sorted(os.listdir(root / "etc/nvidia")) == ["config.yaml"]


@pytest.mark.parametrize("name", ["disable-device-node-modification", "update-nvidia-params"])
def test_both_names_of_the_params_hook_mask_modify_device_files(container_root, name):
    """The reference renamed the hook; specs from either release must keep libcuda from making nodes."""
    root, state = container_root
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/params").write_text("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n")
    # Only the kernel's params are masked: here this process's own /proc/driver, bound from the root.
    script = (f'mount --bind "{root}/proc/driver" /proc/driver && "{CDI_HOOK}" {name} --container-spec="{state}" && '
              f'cat "{root}/proc/driver/nvidia/params"')
    proc = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\n"
    assert (root / "proc/driver/nvidia/params").read_text().endswith("ModifyDeviceFiles: 1\n")


def test_create_soname_symlinks_links_each_library_of_the_folder_and_writes_no_cache(container_root, sim_node):
    """The reference's hook in specs some of its releases wrote: ``ldconfig -n`` on the folders, sandboxed."""
    root, state = container_root
    lib = "usr/lib/x86_64-linux-gnu"
    version = sim_node["driver_version"]
    (root / lib).mkdir(parents=True)
    shutil.copy(os.path.join(sim_node["roots"]["driver_root"], lib, f"libcuda.so.{version}"), root / lib)
    script = (f'exec "{CDI_HOOK}" create-soname-symlinks --folder /{lib} --folder /no/such/dir '
              f'--container-spec="{state}"')
    proc = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(root / lib / "libcuda.so.1") == f"libcuda.so.{version}"
    assert not (root / "etc").exists()
