from __future__ import annotations

import os

import pytest

from tests.support import cgroupfix
from tests.support.fixtures import skip


def _no_mounting(*args, **kwargs):
    raise AssertionError(f"must not mount anything: {args}")


def test_is_idempotent_and_leaves_crun_runnable():
    if os.geteuid() != 0:
        skip("needs root (mounts cgroup hierarchies)")
    cgroupfix.ensure_crun_works()
    assert not cgroupfix.needs_fix()
    assert cgroupfix.ensure_crun_works() == []


def test_no_op_without_a_hybrid_unified_mount(monkeypatch):
    monkeypatch.setattr(cgroupfix, "UNIFIED", "/nonexistent/unified")
    monkeypatch.setattr(cgroupfix.subprocess, "run", _no_mounting)
    assert cgroupfix.ensure_crun_works() == []
    assert not cgroupfix.needs_fix()


def test_no_op_on_pure_cgroup2(monkeypatch):
    monkeypatch.setattr(cgroupfix, "_is_cgroup2", lambda path: True)
    monkeypatch.setattr(cgroupfix, "_unified_controllers", lambda: ["hugetlb"])
    monkeypatch.setattr(cgroupfix.subprocess, "run", _no_mounting)
    assert cgroupfix.ensure_crun_works() == []
    assert not cgroupfix.needs_fix()


def test_mounts_each_controller_cgroup2_still_owns(monkeypatch, tmp_path):
    owned = ["hugetlb", "misc"]
    calls = []

    class Done:
        returncode, stderr = 0, ""

    def fake_run(argv, **kwargs):
        calls.append(argv)
        owned.remove(argv[4])
        return Done()

    monkeypatch.setattr(cgroupfix, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(cgroupfix, "_is_cgroup2", lambda path: path == cgroupfix.UNIFIED)
    monkeypatch.setattr(cgroupfix, "_unified_controllers", lambda: list(owned))
    monkeypatch.setattr(cgroupfix.subprocess, "run", fake_run)
    assert cgroupfix.ensure_crun_works() == ["hugetlb", "misc"]
    assert calls[0] == ["mount", "-t", "cgroup", "-o", "hugetlb", "cgroup",
                        str(tmp_path / "hugetlb")]
    assert (tmp_path / "misc").is_dir()
    assert cgroupfix.ensure_crun_works() == []


def test_a_failed_mount_names_the_controller(monkeypatch, tmp_path):
    class Failed:
        returncode, stderr = 32, "mount: permission denied\n"

    monkeypatch.setattr(cgroupfix, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(cgroupfix, "_is_cgroup2", lambda path: path == cgroupfix.UNIFIED)
    monkeypatch.setattr(cgroupfix, "_unified_controllers", lambda: ["hugetlb"])
    monkeypatch.setattr(cgroupfix.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(cgroupfix.CgroupFixError, match="-o hugetlb.*permission denied"):
        cgroupfix.ensure_crun_works()
