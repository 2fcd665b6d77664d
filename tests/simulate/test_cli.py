from __future__ import annotations

import os

from nvct.cli import main
from nvct.simulate import load_manifest

from .conftest import needs_root


@needs_root
def test_simulate_node_command(tmp_path, capsys):
    d = tmp_path / "node"
    rc = main(["simulate", "node", str(d), "--driver-version", "570.124.06", "--gpus", "2", "--no-mig"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith(f"simulated node at {d}: 2 x NVIDIA H100 80GB HBM3, 0 MIG device(s), "
                             "driver 570.124.06, CUDA 12.8, ")
    assert out[1] == f"config: {d}/nvct-config.toml"
    m = load_manifest(d)
    assert (m["driver_version"], len(m["gpus"]), m["options"]["mig"]) == ("570.124.06", 2, False)
    assert os.path.exists(d / "dev/nvidia1") and not os.path.exists(d / "dev/nvidia2")


@needs_root
def test_simulate_node_with_topology_file(tmp_path, capsys):
    topo = tmp_path / "t4.json"
    topo.write_text('{"models": {"T4": {"name": "Tesla T4", "pci_device_id": "0x1EB810DE", "brand": 2,'
                    ' "architecture": 7, "compute_capability": "7.5", "memory_mib": 15360,'
                    ' "multiprocessors": 40}},'
                    ' "gpus": [{"model": "T4", "minor": 0, "bus_id": "0000:3b:00.0"}]}')
    assert main(["simulate", "node", str(tmp_path / "n"), "--topology", str(topo)]) == 0
    m = load_manifest(tmp_path / "n")
    assert [(g["model"], g["brand"], g["arch"]) for g in m["gpus"]] == [("Tesla T4", "tesla", "7.5")]


def test_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "x").write_text("")
    assert main(["simulate", "node", str(tmp_path), "--no-device-nodes"]) == 1
    assert capsys.readouterr().err == (
        f"nvct: {tmp_path}: directory is not empty and not a simulated node (use --force to build into it anyway)\n")
    assert main(["simulate", "node", str(tmp_path / "n"), "--driver-version", "bogus"]) == 1
    assert capsys.readouterr().err.startswith("nvct: driver version 'bogus'")
    assert main(["simulate", "node", str(tmp_path / "n"), "--topology", str(tmp_path / "missing.json")]) == 1
    assert "topology file not found" in capsys.readouterr().err
    assert main(["simulate", "node", str(tmp_path / "n"), "--gpus", "0"]) == 2


@needs_root
def test_simulate_aarch64_node_command(tmp_path, capsys, monkeypatch):
    from tests.support import arm64

    arm64.ensure_binfmt()
    monkeypatch.setenv("NVCT_SIMULATE_LDCONFIG_AARCH64", arm64.ldconfig())
    d = tmp_path / "node"
    rc = main(["simulate", "node", str(d), "--arch", "aarch64"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith(f"simulated aarch64 node at {d}: 1 x NVIDIA GH200 480GB, 0 MIG device(s), "
                             "driver 550.54.15, CUDA 12.4, ")
    m = load_manifest(d)
    assert (m["arch"], m["options"]["arch"]) == ("aarch64", "aarch64")
    with open(d / "proc/driver/nvidia/version") as f:
        assert f.readline().startswith("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.15  ")
    assert m["gpus"][0]["bus_id"] == "0009:01:00.0"
    assert not os.path.exists(d / "usr/lib/i386-linux-gnu") and not os.path.exists(d / "usr/lib/x86_64-linux-gnu")
    # What aarch64 ldconfig wrote: every driver library flagged libc6,AArch64.
    from nvct.discover import ldcache

    entries = ldcache.load(d / "etc/ld.so.cache")
    assert entries and {e.arch for e in entries} == {"aarch64"} and {e.flags for e in entries} == {0x0A03}
    for name in ("libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"):
        with open(d / "usr/lib/aarch64-linux-gnu" / name, "rb") as f:
            assert f.read(20)[18:20] == (183).to_bytes(2, "little")  # EM_AARCH64
    with open(d / "usr/bin/nvidia-smi", "rb") as f:
        assert f.read(20)[18:20] == (183).to_bytes(2, "little")


def test_an_aarch64_node_without_an_aarch64_ldconfig_is_one_clear_line(tmp_path, capsys, monkeypatch):
    if os.uname().machine == "aarch64":
        return  # its own ldconfig is the node's
    monkeypatch.delenv("NVCT_SIMULATE_LDCONFIG_AARCH64", raising=False)
    rc = main(["simulate", "node", str(tmp_path / "node"), "--arch", "aarch64", "--no-device-nodes"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "needs an aarch64 ldconfig: set NVCT_SIMULATE_LDCONFIG_AARCH64" in err
    assert not os.path.exists(tmp_path / "node" / "usr")  # a failed build leaves nothing
