"""``nvct system create-device-nodes`` and ``create-dev-char-symlinks`` on a fake node.

The node is a temp dev root and a proc root with the driver's files (majors
in ``devices``, the MIG capability files, one GPU). Creating device nodes
needs root (mknod); dry runs and links do not.
"""

from __future__ import annotations

import os
import stat

import pytest

from nvct.cli import main

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")

DEVICES = """Character devices:
  1 mem
195 nvidia
226 drm
510 nvidia-uvm
511 nvidia-caps

Block devices:
  7 loop
"""
GPU_INFO = "Model: \t\t NVIDIA H100\nDevice Minor: \t 3\nGPU UUID: \t GPU-1\nBus Location: \t 0000:1b:00.0\n"
CONTROL = {
    "/dev/nvidiactl": (195, 255, 0o666), "/dev/nvidia-modeset": (195, 254, 0o666),
    "/dev/nvidia-uvm": (510, 0, 0o666), "/dev/nvidia-uvm-tools": (510, 1, 0o666),
    "/dev/nvidia-caps/nvidia-cap1": (511, 1, 0o400), "/dev/nvidia-caps/nvidia-cap2": (511, 2, 0o444),
}


@pytest.fixture
def node(tmp_path):
    """(config path, dev root, proc root) of a fake node with no device nodes yet."""
    proc, dev = tmp_path / "proc", tmp_path / "root"
    (proc / "driver/nvidia/capabilities/mig").mkdir(parents=True)
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia/gpus/0000:1b:00.0").mkdir(parents=True)
    (proc / "devices").write_text(DEVICES)
    (proc / "driver/nvidia/capabilities/mig/config").write_text(
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
    (proc / "driver/nvidia/capabilities/mig/monitor").write_text(
        "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (proc / "driver/nvidia-caps/mig-minors").write_text(
        "config 1\nmonitor 2\ngpu3/gi1/access 30\ngpu3/gi1/ci0/access 31\ngpu4/gi1/access 39\n")
    (proc / "driver/nvidia/gpus/0000:1b:00.0/information").write_text(GPU_INFO)
    dev.mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'[nvct]\ndev-root = "{dev}"\nproc-root = "{proc}"\n')
    return str(config), dev, proc


def _nvct(capsys, config: str, *args: str) -> tuple[int, str, str]:
    code = main(["--config", config, "system", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _node(dev, path):
    st = os.lstat(dev / path.lstrip("/"))
    assert stat.S_ISCHR(st.st_mode), path
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


# --------------------------------------------------------------------------- create-device-nodes


def test_dry_run_lists_the_control_nodes_and_creates_nothing(node, capsys):
    config, dev, _ = node
    code, out, _ = _nvct(capsys, config, "create-device-nodes", "--control-devices", "--dry-run")
    assert code == 0
    assert out.splitlines() == [f"would create {dev}{path} (c {major}:{minor}, mode {mode:04o})"
                                for path, (major, minor, mode) in CONTROL.items()]
    assert os.listdir(dev) == []


@needs_root
def test_control_nodes_are_created_with_the_drivers_majors_and_modes(node, capsys):
    config, dev, _ = node
    code, out, _ = _nvct(capsys, config, "create-device-nodes", "--control-devices")
    assert code == 0, out
    for path, want in CONTROL.items():
        assert _node(dev, path) == want
    assert stat.S_IMODE(os.stat(dev / "dev/nvidia-caps").st_mode) == 0o755
    code, out, _ = _nvct(capsys, config, "create-device-nodes", "--control-devices")
    assert code == 0 and out.splitlines() == [f"exists {dev}{path}" for path in CONTROL]


@needs_root
def test_something_else_in_the_way_is_reported_and_left_alone(node, capsys):
    config, dev, _ = node
    (dev / "dev").mkdir()
    (dev / "dev/nvidiactl").write_text("not a device")
    os.mknod(dev / "dev/nvidia-modeset", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    code, out, err = _nvct(capsys, config, "create-device-nodes", "--control-devices")
    assert code == 1
    assert f"conflict: {dev}/dev/nvidiactl exists but is not the character device 195:255 (a file); left alone" in out
    assert (f"conflict: {dev}/dev/nvidia-modeset exists but is not the character device 195:254 "
            f"(character device 1:3)") in out
    assert err == "nvct: 2 path(s) in the way (see above): nothing was replaced\n"
    assert (dev / "dev/nvidiactl").read_text() == "not a device"
    assert _node(dev, "/dev/nvidia-uvm") == (510, 0, 0o666)


def test_a_missing_uvm_module_skips_its_nodes_with_a_warning(node, capsys):
    config, dev, proc = node
    (proc / "devices").write_text(DEVICES.replace("510 nvidia-uvm\n", ""))
    code, out, err = _nvct(capsys, config, "create-device-nodes", "--control-devices", "--dry-run")
    assert code == 0
    assert f"{proc}/devices: no nvidia-uvm device (module not loaded): its nodes are skipped" in err
    assert "nvidia-uvm" not in out and "nvidiactl" in out


def test_no_nvidia_module_is_a_one_line_error(node, capsys):
    config, _, proc = node
    (proc / "devices").write_text("Character devices:\n  1 mem\n")
    code, _, err = _nvct(capsys, config, "create-device-nodes", "--control-devices", "--dry-run")
    assert code == 1
    assert err == f"nvct: {proc}/devices: no 'nvidia' character device (is the NVIDIA kernel module loaded?)\n"


def test_loading_kernel_modules_only_for_this_kernels_proc(node, capsys):
    config, _, proc = node
    code, out, err = _nvct(capsys, config, "create-device-nodes", "--control-devices", "--load-kernel-modules",
                           "--dry-run")
    assert code == 0 and "would create" in out
    assert "--load-kernel-modules: not loading anything (--dry-run)" in err
    code, out, err = _nvct(capsys, config, "create-device-nodes", "--load-kernel-modules")
    assert f"--load-kernel-modules: {proc} is not this kernel's /proc: nothing loaded" in err


def test_without_control_devices_there_is_nothing_to_do(node, capsys):
    config, dev, _ = node
    code, out, err = _nvct(capsys, config, "create-device-nodes")
    assert code == 0 and out == "" and "pass --control-devices" in err
    assert os.listdir(dev) == []


def test_dev_root_flag_beats_the_config(node, capsys, tmp_path):
    config, _, _ = node
    other = tmp_path / "other"
    code, out, _ = _nvct(capsys, config, "create-device-nodes", "--control-devices", "--dry-run",
                         "--dev-root", str(other))
    assert code == 0 and out.startswith(f"would create {other}/dev/nvidiactl")


# --------------------------------------------------------------------------- create-dev-char-symlinks


@needs_root
def test_links_for_the_existing_nodes_are_relative_and_idempotent(node, capsys):
    config, dev, _ = node
    assert _nvct(capsys, config, "create-device-nodes", "--control-devices")[0] == 0
    code, out, _ = _nvct(capsys, config, "create-dev-char-symlinks")
    assert code == 0, out
    char = dev / "dev/char"
    assert os.readlink(char / "195:255") == "../nvidiactl"
    assert os.readlink(char / "511:1") == "../nvidia-caps/nvidia-cap1"
    assert sorted(os.listdir(char)) == sorted(f"{ma}:{mi}" for ma, mi, _ in CONTROL.values())
    for name in os.listdir(char):
        assert os.stat(char / name).st_rdev == os.makedev(*map(int, name.split(":")))
    code, out, _ = _nvct(capsys, config, "create-dev-char-symlinks")
    assert code == 0 and all(line.startswith("exists ") for line in out.splitlines())


def test_create_all_links_every_possible_node_even_before_it_exists(node, capsys):
    config, dev, _ = node
    code, out, _ = _nvct(capsys, config, "create-dev-char-symlinks", "--create-all")
    assert code == 0, out
    char = dev / "dev/char"
    assert os.readlink(char / "195:3") == "../nvidia3"  # the GPU's minor, from its information file
    assert os.readlink(char / "511:30") == "../nvidia-caps/nvidia-cap30"
    assert os.readlink(char / "511:31") == "../nvidia-caps/nvidia-cap31"
    assert not (char / "511:39").exists() and not os.path.islink(char / "511:39")  # gpu4 is not there
    assert len(os.listdir(char)) == len(CONTROL) + 3


def test_a_stale_link_is_replaced_and_a_non_link_left_alone(node, capsys):
    config, dev, _ = node
    char = dev / "dev/char"
    char.mkdir(parents=True)
    os.symlink("../sda", char / "195:255")
    (char / "195:254").write_text("a file")
    code, out, err = _nvct(capsys, config, "create-dev-char-symlinks", "--create-all")
    assert code == 1
    assert f"replaced {char}/195:255 -> ../nvidiactl (was -> ../sda)" in out
    assert f"conflict: {char}/195:254 exists and is not a symlink; left alone" in out
    assert os.readlink(char / "195:255") == "../nvidiactl"
    assert (char / "195:254").read_text() == "a file"


def test_dry_run_links_nothing(node, capsys):
    config, dev, _ = node
    code, out, _ = _nvct(capsys, config, "create-dev-char-symlinks", "--create-all", "--dry-run")
    assert code == 0
    assert f"would link {dev}/dev/char/195:255 -> ../nvidiactl" in out.splitlines()
    assert not (dev / "dev").exists()


def test_links_elsewhere_still_point_at_the_nodes(node, capsys, tmp_path):
    config, dev, _ = node
    elsewhere = tmp_path / "links"
    code, _, _ = _nvct(capsys, config, "create-dev-char-symlinks", "--create-all", "--dev-char-path", str(elsewhere))
    assert code == 0
    assert os.path.normpath(os.path.join(elsewhere, os.readlink(elsewhere / "195:255"))) == f"{dev}/dev/nvidiactl"


def test_no_existing_nodes_is_said(node, capsys):
    config, dev, _ = node
    code, out, err = _nvct(capsys, config, "create-dev-char-symlinks")
    assert code == 0 and out == ""
    assert f"no NVIDIA device nodes under {dev}/dev: nothing to link" in err


@needs_root
def test_operator_layout_nodes_under_the_driver_root_links_in_the_hosts_dev_char(node, capsys):
    """Only the driver root configured (the GPU Operator): nodes go under it, links stay in /dev/char."""
    config, dev, proc = node
    with open(config, "w") as f:
        f.write(f'[nvidia-container-cli]\nroot = "{dev}"\n[nvct]\nproc-root = "{proc}"\n')
    assert _nvct(capsys, config, "create-device-nodes", "--control-devices")[0] == 0
    assert _node(dev, "/dev/nvidiactl") == (195, 255, 0o666)
    code, out, _ = _nvct(capsys, config, "create-dev-char-symlinks", "--dry-run")
    assert code == 0
    assert f"would link /dev/char/195:255 -> {os.path.relpath(dev / 'dev/nvidiactl', '/dev/char')}" in out.splitlines()
