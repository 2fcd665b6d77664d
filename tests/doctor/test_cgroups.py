"""cgroup.version: legacy mode and --gpus need cgroup v1 device control."""

from __future__ import annotations

import os

from .nodes import MOUNTINFO_V2, one, write


def test_v1_devices_controller_is_ok(node):
    cgroup = one(node.doctor(), "cgroup.version")
    assert cgroup.status == "ok"
    assert cgroup.seen.startswith("cgroup hybrid (v1 controllers, v2 at /sys/fs/cgroup/unified), devices controller "
                                  "at /sys/fs/cgroup/devices")


def test_pure_v2_warns_and_suggests_jit_cdi_in_legacy_mode(node):
    write(node.path("proc/1/mountinfo"), MOUNTINFO_V2)
    node.write_config(mode="legacy")
    cgroup = one(node.doctor(), "cgroup.version")
    assert cgroup.status == "warn"
    assert "cgroup v2 only" in cgroup.seen and "the configured mode is legacy" in cgroup.seen
    assert cgroup.fix.startswith(f"use jit-cdi (or cdi) mode: nvct config -c {node.config} "
                                 f"--set nvidia-container-runtime.mode=jit-cdi -i")
    assert "instead of --gpus" in cgroup.fix


def test_pure_v2_in_auto_mode_only_warns_about_gpus(node):
    write(node.path("proc/1/mountinfo"), MOUNTINFO_V2)
    cgroup = one(node.doctor(), "cgroup.version")
    assert cgroup.status == "warn" and "mode auto works" in cgroup.seen
    assert cgroup.fix.startswith("keep the mode (auto)")


def test_without_the_hosts_mountinfo_this_process_is_asked(node):
    os.unlink(node.path("proc/1/mountinfo"))
    assert "(/proc/self/mountinfo)" in one(node.doctor(), "cgroup.version").seen
