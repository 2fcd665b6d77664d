"""libraries.*: every driver library in the ld cache must be of the kernel module's version."""

from __future__ import annotations

import os
import shutil
import subprocess

from nvct import doctor

from .nodes import one, problems, write

LIB = "usr/lib/x86_64-linux-gnu"


def _remove_nvml(node) -> None:
    """Delete libnvidia-ml (file and links) from the x86_64 dir."""
    for name in os.listdir(node.path(LIB)):
        if name.startswith("libnvidia-ml.so"):
            os.unlink(node.path(f"{LIB}/{name}"))


def test_missing_libnvidia_ml_is_the_load_library_failed_error(node):
    _remove_nvml(node)
    node.regenerate_ldcache()
    findings = node.doctor()
    nvml = one(findings, "libraries.nvml")
    assert nvml.status == "fail"
    assert f"libnvidia-ml.so.1 is not in {node.path('etc/ld.so.cache')}" in nvml.seen
    assert "load library failed: libnvidia-ml.so.1" in nvml.seen
    assert nvml.fix == f"install driver 550.54.15's utility libraries (libnvidia-ml.so.1), then ldconfig -r {node.dir}"
    assert one(findings, "driver.nvml").status == "fail"
    assert doctor.exit_code(findings) == 1


def test_a_library_on_disk_but_not_in_the_cache_asks_for_ldconfig(node):
    saved = node.path("saved")
    os.makedirs(saved)
    _move_nvml(node, saved)
    node.regenerate_ldcache()
    for name in os.listdir(saved):
        os.rename(os.path.join(saved, name), node.path(f"{LIB}/{name}"))
    findings = node.doctor()
    nvml = one(findings, "libraries.nvml")
    assert nvml.status == "fail"
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15 exists but the cache was not rebuilt" in nvml.seen
    assert nvml.fix == f"ldconfig -r {node.dir}"
    uncached = one(findings, "libraries.uncached")
    assert uncached.status == "warn" and "libnvidia-ml.so.550.54.15" in uncached.seen
    # The fix works: after it, nothing is wrong.
    subprocess.run(["ldconfig", "-X", "-r", node.dir], check=True)
    assert problems(node.doctor()) == []


def _move_nvml(node, saved: str) -> None:
    for name in os.listdir(node.path(LIB)):
        if name.startswith("libnvidia-ml.so"):
            os.rename(node.path(f"{LIB}/{name}"), os.path.join(saved, name))


def test_a_library_of_another_driver_version_is_named_with_its_link_fix(node, node535):
    old = os.path.join(node535["roots"]["driver_root"], LIB, "libcuda.so.535.161.08")
    shutil.copy(old, node.path(LIB))
    os.unlink(node.path(f"{LIB}/libcuda.so.1"))
    os.symlink("libcuda.so.535.161.08", node.path(f"{LIB}/libcuda.so.1"))
    node.regenerate_ldcache()
    findings = node.doctor()
    compute = [f for f in findings if f.id == "libraries.compute"]
    assert [f.status for f in compute] == ["fail"]
    assert compute[0].seen == (f"libcuda.so.1 (x86_64) resolves to /{LIB}/libcuda.so.535.161.08, of driver "
                               f"535.161.08, but the kernel module is 550.54.15: containers do not get it")
    assert compute[0].fix == f"ln -sf libcuda.so.550.54.15 {node.path(LIB)}/libcuda.so.1 && ldconfig -r {node.dir}"
    # ...and the fix repairs it.
    subprocess.run(compute[0].fix.replace("ldconfig -r", "ldconfig -X -r"), shell=True, check=True)
    assert problems(node.doctor()) == []


def test_libraries_of_an_upgrade_without_reboot_are_one_finding(node):
    write(node.path("proc/driver/nvidia/version"),
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 00:00:00 UTC 2024\n")
    versions = one(node.doctor(), "libraries.versions")
    assert versions.status == "fail"
    assert "is 550.54.15, the kernel module is 535.161.08" in versions.seen
    assert versions.fix.startswith("reboot")


def test_a_cache_entry_whose_file_is_gone_warns(node):
    os.unlink(node.path(f"{LIB}/libnvidia-cfg.so.550.54.15"))
    utility = one(node.doctor(), "libraries.utility")
    assert utility.status == "warn"
    assert "lists libnvidia-cfg.so.1 => /usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1" in utility.seen
    assert utility.seen.endswith("which do not exist")


def test_a_corrupt_cache_fails_with_ldconfig(node):
    write(node.path("etc/ld.so.cache"), "not a cache")
    findings = node.doctor()
    cache = one(findings, "libraries.ldcache")
    assert cache.status == "fail" and cache.fix == f"ldconfig -r {node.dir}"
    assert one(findings, "libraries.nvml").status == "info"
