"""cgroup.version: legacy mode and --gpus grant devices on cgroup v1 and v2."""

from __future__ import annotations

import os

from .nodes import MOUNTINFO_V2, one, write


def test_v1_devices_controller_is_ok(node):
    cgroup = one(node.doctor(), "cgroup.version")
    assert cgroup.status == "ok"
    assert cgroup.seen.startswith("cgroup hybrid (v1 controllers, v2 at /sys/fs/cgroup/unified), devices controller "
                                  "at /sys/fs/cgroup/devices")


def test_pure_v2_is_ok_in_legacy_mode(node):
    write(node.path("proc/1/mountinfo"), MOUNTINFO_V2)
    node.write_config(mode="legacy")
    cgroup = one(node.doctor(), "cgroup.version")
    assert cgroup.status == "ok", cgroup
    assert cgroup.seen.startswith("cgroup v2 at /sys/fs/cgroup") and "eBPF" in cgroup.seen


def test_without_the_hosts_mountinfo_this_process_is_asked(node):
    os.unlink(node.path("proc/1/mountinfo"))
    assert "(/proc/self/mountinfo)" in one(node.doctor(), "cgroup.version").seen
