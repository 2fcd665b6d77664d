from __future__ import annotations

import re

from nvct.simulate import devices, procfs, topology
from nvct.simulate.driver import driver

DRV = driver("550.54.15")
TOPO = topology.resolve(topology.load(None)[0])


def test_version_file_is_byte_exact():
    assert procfs.version(DRV) == (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
        "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n")


def test_information_file_is_byte_exact_for_gpu0():
    assert procfs.information(DRV, TOPO.gpus[0]) == (
        "Model: \t\t NVIDIA H100 80GB HBM3\n"
        "IRQ:   \t\t 176\n"
        "GPU UUID: \t GPU-df222005-1a28-580c-823e-105777e89104\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t 0000:1b:00.0\n"
        "Device Minor: \t 0\n"
        "GPU Firmware: \t 550.54.15\n"
        "GPU Excluded:\t No\n")


def test_params_have_the_550_shape():
    lines = procfs.files(DRV, TOPO)["driver/nvidia/params"][0].splitlines()
    assert len(lines) == 42
    assert lines[:6] == ["ResmanDebugLevel: 4294967295", "RmLogonRC: 1", "ModifyDeviceFiles: 1",
                         "DeviceFileUID: 0", "DeviceFileGID: 0", "DeviceFileMode: 438"]
    assert lines[-1] == 'ExcludedGpus: ""'
    assert all(re.match(r'^\w+: (\d+|"[^"]*")$', ln) for ln in lines)
    assert len(procfs.files(driver("535.161.08"), TOPO)["driver/nvidia/params"][0].splitlines()) < 42


def test_mig_capability_files():
    files = procfs.files(DRV, TOPO)
    assert files["driver/nvidia/capabilities/mig/config"] == (
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n", 0o400)
    assert files["driver/nvidia/capabilities/mig/monitor"] == (
        "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n", 0o444)
    assert files["driver/nvidia/capabilities/gpu0/mig/gi1/access"][0].startswith("DeviceFileMinor: 12\n")
    assert files["driver/nvidia/capabilities/gpu0/mig/gi1/ci0/access"][0].startswith("DeviceFileMinor: 13\n")
    assert files["driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access"][0].startswith("DeviceFileMinor: 22\n")
    assert not any("gpu1/" in k for k in files)


def test_mig_minors_is_the_full_static_table():
    lines = procfs.mig_minors().splitlines()
    assert len(lines) == 2 + 32 * 15 * 9
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in lines and "gpu0/gi2/ci0/access 22" in lines
    assert lines[-1] == "gpu31/gi14/ci7/access 4322"


def test_proc_devices_format_and_majors():
    text = devices.proc_devices(DRV, TOPO)
    head, block = text.split("\n\n")
    assert head.startswith("Character devices:\n") and block.startswith("Block devices:\n")
    assert all(re.match(r"^[ \d]{3}\d* \S+$", ln) for ln in head.splitlines()[1:])
    for line in ("195 nvidia", "509 nvidia-caps-imex-channels", "510 nvidia-uvm", "511 nvidia-caps", "  1 mem"):
        assert line in head.splitlines()
    assert "195 nvidia-frontend" in devices.proc_devices(driver("535.161.08"), TOPO)
