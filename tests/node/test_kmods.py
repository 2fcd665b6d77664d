"""load-kmods: modprobe what is missing (never with the caller's env), log failures, never fail."""

from __future__ import annotations

import os

from nvct.node import kmods


def _fake_modprobe(tmp_path, failing: str = "") -> tuple[str, str]:
    record = tmp_path / "argv"
    script = tmp_path / "modprobe"
    script.write_text(f'#!/bin/sh\necho "$1 PATH=$PATH LD=${{LD_PRELOAD:-}}" >> {record}\n'
                      f'[ "$1" = "{failing}" ] && {{ echo "modprobe: FATAL: Module $1 not found." >&2; exit 1; }}\n'
                      'exit 0\n')
    script.chmod(0o755)
    return str(script), str(record)


def _calls(record: str) -> list[str]:
    with open(record) as f:
        return f.read().splitlines()


def test_loads_only_the_missing_modules(tmp_path, monkeypatch):
    modprobe, record = _fake_modprobe(tmp_path, failing="nvidia_modeset")
    monkeypatch.setattr(kmods, "loaded_modules", lambda proc_root="/proc": {"nvidia"})
    monkeypatch.setattr(kmods, "_create_nodes", lambda proc_root, dev_root: [])
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent.so")
    problems = kmods.load("/proc", "/", modprobe=modprobe)
    calls = _calls(record)
    assert [c.split()[0] for c in calls] == ["nvidia_uvm", "nvidia_modeset"]
    assert all(c.endswith("PATH=/usr/sbin:/usr/bin:/sbin:/bin LD=") for c in calls)
    assert problems == [f"could not load kernel module nvidia_modeset ({modprobe}: "
                        "modprobe: FATAL: Module nvidia_modeset not found.)"]


def test_without_nvidia_the_others_are_not_tried(tmp_path, monkeypatch):
    modprobe, record = _fake_modprobe(tmp_path, failing="nvidia")
    monkeypatch.setattr(kmods, "loaded_modules", lambda proc_root="/proc": set())
    monkeypatch.setattr(kmods, "_create_nodes", lambda proc_root, dev_root: [])
    problems = kmods.load("/proc", "/", modprobe=modprobe)
    assert [c.split()[0] for c in _calls(record)] == ["nvidia"]
    assert len(problems) == 3 and "nvidia is not loaded" in problems[1]


def test_a_kernel_without_modules_or_another_proc_root_loads_nothing(tmp_path, monkeypatch):
    modprobe, record = _fake_modprobe(tmp_path)
    assert kmods.load(str(tmp_path), "/", modprobe=modprobe) == []
    monkeypatch.setattr(kmods, "loaded_modules", lambda proc_root="/proc": None)
    monkeypatch.setattr(kmods, "_create_nodes", lambda proc_root, dev_root: [])
    assert kmods.load("/proc", "/", modprobe=modprobe) == []
    assert not os.path.exists(record)


def test_modprobe_path_is_the_kernels():
    assert kmods.modprobe_path().startswith("/")
