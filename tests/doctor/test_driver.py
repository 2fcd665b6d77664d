"""driver.*: the kernel module, its version, the GPUs in procfs, NVML."""

from __future__ import annotations

import os
import shutil

from nvct import doctor

from .nodes import one, problems, write


def test_module_not_loaded_is_one_failure_with_modprobe(node):
    shutil.rmtree(node.path("proc/driver/nvidia"))
    findings = node.doctor()
    module = one(findings, "driver.module")
    assert module.status == "fail"
    assert f"no {node.path('proc/driver/nvidia')}: the NVIDIA kernel module is not loaded" in module.seen
    assert module.fix.startswith("modprobe nvidia")
    # Everything that needs the module says it was not checked, rather than failing again.
    assert [f.id for f in findings if f.status == "fail"] == ["driver.module"]
    assert one(findings, "driver.gpus").status == "info"
    assert doctor.exit_code(findings) == 1


def test_proc_modules_is_only_a_second_witness(node):
    write(node.path("proc/modules"), "nvidia_uvm 1531904 0 - Live 0x0\nnvidia 56463360 1 nvidia_uvm, Live 0x0\n")
    assert "and /proc/modules lists it" in one(node.doctor(), "driver.module").seen
    shutil.rmtree(node.path("proc/driver/nvidia"))
    module = one(node.doctor(), "driver.module")
    assert module.status == "fail" and "proc root may not be the host's /proc" in module.seen


def test_a_version_file_without_a_version_fails(node):
    write(node.path("proc/driver/nvidia/version"), "garbage\n")
    version = one(node.doctor(), "driver.version")
    assert version.status == "fail"
    assert "no driver version found" in version.seen


def test_gpus_are_listed_from_procfs(node):
    gpus = one(node.doctor(), "driver.gpus")
    assert gpus.status == "ok"
    assert gpus.seen == "8 GPU(s) in procfs (NVIDIA H100 80GB HBM3), 2 MIG device(s)"


def test_no_gpu_in_procfs_fails(node):
    shutil.rmtree(node.path("proc/driver/nvidia/gpus"))
    os.makedirs(node.path("proc/driver/nvidia/gpus"))
    gpus = one(node.doctor(), "driver.gpus")
    assert gpus.status == "fail" and "no GPU in" in gpus.seen  # a GPU request fails (test_verdicts.py)


def test_nvml_failing_to_initialize_names_the_device_nodes(node):
    os.unlink(node.path("dev/nvidiactl"))  # the mock NVML then reports the driver as not loaded
    nvml = one(node.doctor(), "driver.nvml")
    assert nvml.status == "warn"  # the host's NVML only: containers get their nodes made (test_verdicts.py)
    assert "NVML on this host does not initialize" in nvml.seen and "Driver Not Loaded" in nvml.seen
    assert "devices.nodes" in nvml.fix


def test_nvml_of_another_version_than_the_module_is_the_version_mismatch(node):
    write(node.path("proc/driver/nvidia/version"),
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 00:00:00 UTC 2024\n")
    findings = node.doctor()
    nvml = one(findings, "driver.nvml")
    assert nvml.status == "fail"
    assert "Driver/library version mismatch" in nvml.seen
    assert problems(findings) and all(f.status == "fail" for f in problems(findings))
