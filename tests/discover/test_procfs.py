import pytest

from nvct.base.errors import DriverError
from nvct.discover import procfs

INFO = ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 176\nGPU UUID: \t GPU-df222005-1a28-580c-823e-105777e89104\n"
        "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t 0000:1b:00.0\nDevice Minor: \t 3\nGPU Firmware: \t 550.54.15\nGPU Excluded:\t No\n")
VERSION = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
           "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n")


def test_driver_version_proprietary_and_open_module(fs):
    fs.create_file("/p/driver/nvidia/version", contents=VERSION)
    assert procfs.driver_version("/p") == "550.54.15"
    fs.create_file("/q/driver/nvidia/version", contents=(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  (dvs-builder@U16)\n"))
    assert procfs.driver_version("/q") == "570.124.06"


def test_missing_module_names_the_file(fs):
    with pytest.raises(DriverError, match=r"^/p/driver/nvidia/version: not found: the NVIDIA driver is not loaded "
                                          r"\(load its kernel module: modprobe nvidia\)$"):
        procfs.driver_version("/p")


def test_gpus_in_bus_order_with_minor_from_information(fs):
    fs.create_file("/p/driver/nvidia/gpus/0000:43:00.0/information",
                   contents=INFO.replace("1b:00", "43:00").replace("Minor: \t 3", "Minor: \t 1"))
    fs.create_file("/p/driver/nvidia/gpus/0000:1b:00.0/information", contents=INFO)
    gpus = procfs.gpus("/p")
    assert [(g.bus_id, g.minor) for g in gpus] == [("0000:1b:00.0", 3), ("0000:43:00.0", 1)]
    assert gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert gpus[0].uuid == "GPU-df222005-1a28-580c-823e-105777e89104"
    assert not gpus[0].excluded


def test_information_without_minor_is_an_error(fs):
    fs.create_file("/p/driver/nvidia/gpus/0000:1b:00.0/information", contents="Model: \t x\n")
    with pytest.raises(DriverError, match="information: no valid 'Device Minor' line"):
        procfs.gpus("/p")


def test_mig_instances_in_gi_ci_order(fs):
    for path in ("gi2/access", "gi2/ci0/access", "gi1/access", "gi1/ci1/access", "gi1/ci0/access"):
        fs.create_file(f"/p/driver/nvidia/capabilities/gpu0/mig/{path}", contents="DeviceFileMinor: 1\n")
    assert [(m.gi, m.ci) for m in procfs.mig_instances("/p", 0)] == [(1, 0), (1, 1), (2, 0)]
    assert procfs.mig_instances("/p", 1) == []


def test_mig_minors_and_char_majors(fs):
    fs.create_file("/p/driver/nvidia-caps/mig-minors",
                   contents="config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
    assert procfs.mig_minors("/p")["gpu0/gi1/ci0/access"] == 13
    fs.create_file("/p/devices", contents=("Character devices:\n  1 mem\n195 nvidia\n509 nvidia-caps-imex-channels\n"
                                           "510 nvidia-uvm\n511 nvidia-caps\n\nBlock devices:\n  8 sd\n"))
    majors = procfs.char_majors("/p")
    assert majors["nvidia"] == 195 and majors["nvidia-uvm"] == 510 and majors["nvidia-caps"] == 511
    assert "sd" not in majors


def test_mig_minor_looks_names_up_at_line_starts_only():
    table = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu10/gi1/access 1353\n"
    assert procfs.mig_minor(table, "gpu0/gi1/access") == 12
    assert procfs.mig_minor(table, "gpu0/gi1/ci0/access") == 13
    assert procfs.mig_minor(table, "gpu10/gi1/access") == 1353
    assert procfs.mig_minor(table, "pu0/gi1/access") is None  # inside a name, not a line
    assert procfs.mig_minor(table, "gpu0/gi2/access") is None
    assert procfs.mig_minor("gpu0/gi1/access x\n", "gpu0/gi1/access") is None
    assert procfs.mig_minor("", "config") is None


def test_mig_minor_agrees_with_the_parsed_table_on_every_line_of_a_driver_table(sim_node):
    root = sim_node["roots"]["proc_root"]
    table = procfs.mig_minors_table(root)
    parsed = procfs.mig_minors(root)
    assert len(parsed) > 4000
    assert all(procfs.mig_minor(table, name) == minor for name, minor in parsed.items())
