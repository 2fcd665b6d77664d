"""nvct.node.devices: which control nodes a driver has."""

from __future__ import annotations

import pytest

from nvct.discover import procfs
from nvct.node import devices


def _proc(tmp_path, *, config_minor=True, monitor_minor=True):
    proc = tmp_path / "proc"
    (proc / "driver/nvidia/capabilities/mig").mkdir(parents=True)
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "devices").write_text("Character devices:\n195 nvidia-frontend\n241 nvidia-caps\n\nBlock devices:\n")
    for name, minor, wanted in (("config", 1, config_minor), ("monitor", 2, monitor_minor)):
        (proc / f"driver/nvidia/capabilities/mig/{name}").write_text(
            (f"DeviceFileMinor: {minor}\n" if wanted else "") + "DeviceFileMode: 256\n")
    (proc / "driver/nvidia-caps/mig-minors").write_text(
        "config 1\nmonitor 2\n" + "".join(f"gpu{g}/gi{i}/access {3 + g * 135 + i * 9}\n"
                                         for g in range(8) for i in range(15)))
    return str(proc)


def test_the_mig_capability_nodes_come_from_their_capability_files_without_the_minors_table(tmp_path, monkeypatch):
    proc = _proc(tmp_path)
    monkeypatch.setattr(procfs, "mig_minors_table", pytest.fail)  # ~4300 lines on a real node
    monkeypatch.setattr(procfs, "mig_minors", pytest.fail)
    caps = [n for n in devices.control_nodes(proc) if n.path.startswith("/dev/nvidia-caps/")]
    assert [(n.path, n.major, n.minor, n.mode) for n in caps] == [
        ("/dev/nvidia-caps/nvidia-cap1", 241, 1, 0o400), ("/dev/nvidia-caps/nvidia-cap2", 241, 2, 0o400)]


def test_a_capability_file_without_its_minor_falls_back_to_the_minors_table(tmp_path):
    proc = _proc(tmp_path, monitor_minor=False)
    caps = [n.path for n in devices.control_nodes(proc) if n.path.startswith("/dev/nvidia-caps/")]
    assert caps == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]
