"""Device access through the devices cgroup: v1 devices.allow, v2 eBPF programs."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

from nvct.base.errors import ContainerError
from nvct.linux import cgroups
from nvct.linux.cgroups import allow_devices, cgroup_version, devices_cgroup_dir, format_rule
from nvct.linux.namespaces import MountInfo

DEVICES_V1 = "/sys/fs/cgroup/devices"
needs_v1_devices = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{DEVICES_V1}/devices.allow"),
    reason="needs root and a cgroup v1 devices hierarchy at /sys/fs/cgroup/devices")


@pytest.mark.parametrize("rule, text", [
    (("c", 195, 0, "rw"), "c 195:0 rw"),
    (("c", 195, None, "rwm"), "c 195:* rwm"),
    (("b", None, None, "r"), "b *:* r"),
    (("a", None, None, "rwm"), "a"),
])
def test_format_rule(rule, text):
    assert format_rule(rule) == text


@pytest.mark.parametrize("rule", [
    ("x", 1, 1, "rw"), ("c", -1, 0, "rw"), ("c", "195", 0, "rw"), ("c", 1, 1, ""),
    ("c", 1, 1, "rwx"), ("c", 1, 1, "rr"), ("c", True, 1, "r"),
])
def test_malformed_rules_are_rejected(rule):
    with pytest.raises(ValueError, match="device rule"):
        format_rule(rule)


def test_malformed_rule_is_a_container_error_before_any_write(monkeypatch):
    monkeypatch.setattr(cgroups, "devices_cgroup_dir", lambda pid: pytest.fail("looked up"))
    with pytest.raises(ContainerError, match="device rule"):
        allow_devices(1, [("c", 195, 0, "rw"), ("c", 195, 0, "write")])


def _fake(monkeypatch, cgroup_lines, mountinfo):
    parsed = [tuple(line.split(":", 2)) for line in cgroup_lines]
    monkeypatch.setattr(cgroups, "_controllers", lambda pid: [
        (h, c.split(",") if c else [], p) for h, c, p in parsed])
    monkeypatch.setattr(cgroups, "mounts", lambda: iter(mountinfo))


def _cgroup_mount(point, root="/", options=("rw", "devices")):
    return MountInfo(point, root, "cgroup", "cgroup", tuple(options))


def _cgroup2_mount(point, root="/"):
    return MountInfo(point, root, "cgroup2", "cgroup2", ("rw",))


@pytest.mark.parametrize("point", ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"])
def test_v2_grants_through_the_cgroup2_mount(monkeypatch, point):
    _fake(monkeypatch, ["0::/system.slice/docker-abc.scope"], [_cgroup2_mount(point)])
    calls = []
    monkeypatch.setattr("nvct.linux.bpf.allow_char_devices", lambda d, devs: calls.append((d, list(devs))))
    assert cgroup_version(42) == 2
    allow_devices(42, [("c", 195, 0, "rwm"), ("c", 195, 255, "rwm")])
    assert calls == [(f"{point}/system.slice/docker-abc.scope", [(195, 0), (195, 255)])]


def test_v2_a_policy_program_that_denies_is_one_line_naming_it(monkeypatch):
    from nvct.linux import bpf

    _fake(monkeypatch, ["0::/ctr"], [_cgroup2_mount("/sys/fs/cgroup")])
    why = ("device program 7 (site_deny) on /sys/fs/cgroup/ctr, attached by someone other than the runtime, "
           "denies c 195:0 r: a device policy nvct does not override")

    def refuse(directory, devices):
        raise bpf.PolicyError(why)

    monkeypatch.setattr("nvct.linux.bpf.allow_char_devices", refuse)
    with pytest.raises(ContainerError) as info:
        allow_devices(42, [("c", 195, 0, "rwm")])
    assert str(info.value) == f"cgroup v2: {why}"


def test_v2_a_policy_nvct_cannot_follow_is_a_warning(monkeypatch):
    from nvct.base.log import logger

    _fake(monkeypatch, ["0::/ctr"], [_cgroup2_mount("/sys/fs/cgroup")])
    monkeypatch.setattr("nvct.linux.bpf.allow_char_devices",
                        lambda d, devs: ["device program 9 (x) ...; left as it is"])
    warned = []
    monkeypatch.setattr(logger, "warning", lambda msg, *args, **kw: warned.append(msg % args))
    allow_devices(42, [("c", 195, 0, "rwm")])
    assert warned == ["cgroup v2: device program 9 (x) ...; left as it is"]


def test_unified_root_wins_over_v1_lines(monkeypatch):
    # The kernel lists v1 hierarchies in /proc/<pid>/cgroup even when only cgroup2 is mounted.
    _fake(monkeypatch, ["5:devices:/", "0::/ctr"], [_cgroup2_mount("/sys/fs/cgroup")])
    assert cgroup_version(42) == 2


def test_v2_without_a_cgroup2_mount_is_one_line(monkeypatch):
    _fake(monkeypatch, ["0::/ctr"], [])
    with pytest.raises(ContainerError, match="no mounted cgroup2 hierarchy"):
        allow_devices(42, [("c", 195, 0, "rwm")])


def test_v2_refuses_partial_rules(monkeypatch):
    _fake(monkeypatch, ["0::/ctr"], [_cgroup2_mount("/sys/fs/cgroup")])
    with pytest.raises(ContainerError, match="whole char devices"):
        allow_devices(42, [("c", 195, None, "rwm")])


def test_no_rules_touch_nothing(monkeypatch):
    monkeypatch.setattr(cgroups, "cgroup_version", lambda pid: pytest.fail("looked up"))
    allow_devices(42, [])


def test_hybrid_with_v1_devices_is_version_1(monkeypatch):
    _fake(monkeypatch, ["5:devices:/docker/abc", "1:name=systemd:/docker/abc", "0::/"],
          [_cgroup_mount("/sys/fs/cgroup/devices")])
    assert cgroup_version(42) == 1
    assert devices_cgroup_dir(42) == "/sys/fs/cgroup/devices/docker/abc"


def test_hierarchy_mounted_below_its_root(monkeypatch):
    # e.g. the hook itself runs in a container that sees only /kubepods/x
    _fake(monkeypatch, ["3:cpuset,devices:/kubepods/x/ctr"],
          [_cgroup_mount("/elsewhere", options=("rw", "cpu")),
           _cgroup_mount("/sys/fs/cgroup/devices", root="/kubepods/x")])
    assert devices_cgroup_dir(42) == "/sys/fs/cgroup/devices/ctr"


def test_root_cgroup_maps_to_the_mount_point(monkeypatch):
    _fake(monkeypatch, ["5:devices:/"], [_cgroup_mount("/sys/fs/cgroup/devices")])
    assert devices_cgroup_dir(42) == "/sys/fs/cgroup/devices"


def test_unmounted_hierarchy_is_an_error(monkeypatch):
    _fake(monkeypatch, ["5:devices:/docker/abc"],
          [_cgroup_mount("/sys/fs/cgroup/devices", root="/other")])
    with pytest.raises(ContainerError, match="no mounted cgroup v1 devices hierarchy"):
        devices_cgroup_dir(42)


@pytest.mark.parametrize("path", ["/docker/../../etc", "docker/abc", "/a/./b"])
def test_odd_cgroup_paths_are_refused(monkeypatch, path):
    _fake(monkeypatch, [f"5:devices:{path}"], [_cgroup_mount("/sys/fs/cgroup/devices")])
    with pytest.raises(ContainerError, match="odd cgroup path"):
        devices_cgroup_dir(42)


def test_unknown_pid_is_a_container_error():
    with pytest.raises(ContainerError, match="cgroups of pid 999999999"):
        cgroup_version(999999999)


@pytest.fixture
def confined_sleeper():
    """A sleeping process alone in a fresh devices cgroup that denies everything."""
    group = f"{DEVICES_V1}/nvct-test-{secrets.token_hex(4)}"
    os.mkdir(group)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        with open(f"{group}/cgroup.procs", "w") as f:
            f.write(str(proc.pid))
        with open(f"{group}/devices.deny", "w") as f:
            f.write("a")
        yield proc.pid, group
    finally:
        proc.kill()
        proc.wait()
        for sub in sorted((d for d, _, _ in os.walk(group)), key=len, reverse=True):
            os.rmdir(sub)


@needs_v1_devices
def test_allow_devices_in_a_real_v1_cgroup(confined_sleeper):
    pid, group = confined_sleeper
    assert cgroup_version(pid) == 1
    assert devices_cgroup_dir(pid) == group
    with open(f"{group}/devices.list") as f:
        assert f.read() == ""
    allow_devices(pid, [("c", 195, 0, "rw"), ("c", 195, 255, "rwm")])
    with open(f"{group}/devices.list") as f:
        assert f.read().splitlines() == ["c 195:0 rw", "c 195:255 rwm"]


@needs_v1_devices
def test_a_rule_the_parent_denies_is_an_error(confined_sleeper):
    pid, group = confined_sleeper
    allow_devices(pid, [("c", 195, 0, "rw")])
    child = f"{group}/inner"
    os.mkdir(child)
    with open(f"{child}/cgroup.procs", "w") as f:
        f.write(str(pid))
    with pytest.raises(ContainerError, match=r"devices.allow: cannot allow 'c 195:1 rw'"):
        allow_devices(pid, [("c", 195, 1, "rw")])
    with open(f"{group}/cgroup.procs", "w") as f:  # out again, so inner can go
        f.write(str(pid))


def test_cgroup2_mounted_over_a_hybrid_tree_hides_the_old_unified(monkeypatch):
    tmpfs = MountInfo("/sys/fs/cgroup", "/", "tmpfs", "tmpfs", ("rw",))
    _fake(monkeypatch, ["5:devices:/", "0::/docker/abc"],
          [tmpfs, _cgroup2_mount("/sys/fs/cgroup/unified"), _cgroup_mount("/sys/fs/cgroup/devices"),
           _cgroup2_mount("/sys/fs/cgroup")])
    assert cgroup_version(42) == 2
    assert cgroups.unified_cgroup_dir(42) == "/sys/fs/cgroup/docker/abc"
