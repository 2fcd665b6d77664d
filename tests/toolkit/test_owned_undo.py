"""An installer undoes its own changes and no one else's (issue 23, item 1), without root.

The node was configured by ``nvidia-ctk runtime configure`` first; the installer adds its
runtimes on top. Whether it fails (a restart through a systemd that is not there) or is
stopped, the files go back to what ``runtime configure`` wrote, byte for byte, undo record
included.
"""

from __future__ import annotations

import os
import sys

import pytest

from nvct import engines as runtimes
from nvct.base.errors import NvctError
from nvct.toolkit import Installation, Options

CONTAINERD = 'version = 2\n\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")


@pytest.fixture
def no_systemd(tmp_path, monkeypatch):
    """A ``systemctl`` first on PATH that answers as it does on a host without systemd."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{NO_SYSTEMD}EOF\nexit 1\n")
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")


def _snapshot(directory) -> dict:
    out = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def _options(tmp_path, config, **kwargs) -> Options:
    return Options(install_dir=str(tmp_path / "install"), driver_root="/", python=sys.executable, host_root="/",
                   runtime="containerd", config=str(config), **kwargs)


def _configured_by_ctk(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    config.write_text(CONTAINERD)
    runtimes.configure("containerd", str(config), {"nvidia": "/usr/bin/nvidia-container-runtime"})
    assert (etc / "conf.d" / "99-nvidia.toml").exists()
    return etc, config


def test_a_failing_installer_leaves_the_earlier_runtime_configure_byte_for_byte(tmp_path, no_systemd):
    etc, config = _configured_by_ctk(tmp_path)
    before = _snapshot(etc)
    log: list = []
    with pytest.raises(NvctError) as failed:
        Installation(_options(tmp_path, config, restart_mode="systemd"), log.append).install()
    assert str(failed.value) == ("systemctl restart containerd: exit status 1: Failed to connect to bus: Host is "
                                 "down; no systemd runs on the host: set RUNTIME_RESTART_MODE=none "
                                 "(--restart-mode=none) and restart containerd yourself")
    assert _snapshot(etc) == before, "\n".join(log)
    assert not os.path.exists(tmp_path / "install" / "toolkit")


def test_a_stopped_installer_gives_back_what_runtime_configure_wrote(tmp_path):
    etc, config = _configured_by_ctk(tmp_path)
    before = _snapshot(etc)
    inst = Installation(_options(tmp_path, config, restart_mode="none"), lambda _m: None)
    inst.install()
    drop_in = (etc / "conf.d" / "99-nvidia.toml").read_text()
    assert f'BinaryName = "{tmp_path}/install/toolkit/nvidia-container-runtime"' in drop_in
    inst.uninstall()
    assert _snapshot(etc) == before
    # and runtime configure's own undo still takes the node back to before it
    runtimes.unconfigure("containerd", str(config))
    assert _snapshot(etc) == {"config.toml": CONTAINERD.encode()}


def test_runtime_unconfigure_under_a_running_installer_waits_for_it(tmp_path):
    """The installer's drop-in and import build on runtime configure's: they go together, at its stop."""
    etc, config = _configured_by_ctk(tmp_path)
    inst = Installation(_options(tmp_path, config, restart_mode="none"), lambda _m: None)
    inst.install()
    installed = _snapshot(etc)
    change = runtimes.unconfigure("containerd", str(config))
    assert not change.changed
    assert change.notes == [f"{config}: {inst.engine.owner} changed it after nvct runtime configure did; the "
                            f"earlier changes are undone with its own"]
    assert {k: v for k, v in _snapshot(etc).items() if not k.endswith("nvct-undo")} == \
        {k: v for k, v in installed.items() if not k.endswith("nvct-undo")}
    inst.uninstall()
    assert _snapshot(etc) == {"config.toml": CONTAINERD.encode()}


def test_no_backup_holds_nvcts_own_entry(tmp_path):
    """No daemon.json, configure, then --set-as-default, then unconfigure: no daemon.json.nvct.bak."""
    daemon = tmp_path / "daemon.json"
    runtimes.configure("docker", str(daemon))
    runtimes.configure("docker", str(daemon), set_default="nvidia")
    assert not (tmp_path / "daemon.json.nvct.bak").exists()
    change = runtimes.unconfigure("docker", str(daemon))
    assert os.listdir(tmp_path) == [] and not any("nvct.bak" in n for n in change.notes), change.notes


def test_an_older_nvcts_backup_of_its_own_entry_is_removed_and_said(tmp_path):
    daemon = tmp_path / "daemon.json"
    runtimes.configure("docker", str(daemon))
    (tmp_path / "daemon.json.nvct.bak").write_bytes(daemon.read_bytes())  # what an older nvct left
    runtimes.configure("docker", str(daemon), set_default="nvidia")
    change = runtimes.unconfigure("docker", str(daemon))
    assert os.listdir(tmp_path) == []
    assert f"removed {daemon}.nvct.bak: it did not hold {daemon} as it was before nvct (an older nvct saved " \
           f"its own entries there)" in change.notes


def test_the_entry_programs_keep_the_reference_restart_modes(monkeypatch):
    """docker and containerd: signal; cri-o: systemd (the reference's per-engine defaults)."""
    from nvct.programs import installer

    seen = []
    # The installer's own name for nvct's main: a real install here would configure this host's engines.
    monkeypatch.setattr(installer, "nvct_main", lambda argv: seen.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", ["nvidia-ctk-installer"])
    for engine in ("docker", "containerd", "crio"):
        monkeypatch.setenv("RUNTIME", engine)
        assert installer.main([]) == 0
    assert seen == [["toolkit", "install"]] * 3
    assert [Options(runtime=e).resolved().restart_mode for e in ("docker", "containerd", "crio")] == \
        ["signal", "signal", "systemd"]


def test_an_older_nvcts_record_is_given_back_byte_for_byte(tmp_path):
    """A version 1 record (one layer, owner unknown) under an installer's: its undo writes it back as it was."""
    import json

    etc, config = _configured_by_ctk(tmp_path)
    record = etc / "config.toml.nvct-undo"
    data = json.loads(record.read_text())
    [layer] = data["layers"]
    record.write_text(json.dumps({"nvct-undo": 1, "engine": data["engine"], "files": layer["files"]}, indent=1))
    before = _snapshot(etc)
    inst = Installation(_options(tmp_path, config, restart_mode="none"), lambda _m: None)
    inst.install()
    assert json.loads(record.read_text())["nvct-undo"] == 2
    inst.uninstall()
    assert _snapshot(etc) == before


def _as_version_1(record) -> None:
    import json

    data = json.loads(record.read_text())
    files = [entry for layer in data["layers"] for entry in layer["files"]]
    record.write_text(json.dumps({"nvct-undo": 1, "engine": data["engine"], "files": files}, indent=1))


def test_an_older_installers_record_is_taken_over_by_the_new_installer(tmp_path):
    """A killed installer of an older nvct left a version 1 record naming its toolkit: the new one undoes it."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config = etc / "config.toml"
    config.write_text(CONTAINERD)
    opts = _options(tmp_path, config, restart_mode="none")
    Installation(opts, lambda _m: None).install()  # then killed: its files and record stay
    _as_version_1(etc / "config.toml.nvct-undo")
    inst = Installation(opts, lambda _m: None)
    inst.install()
    inst.uninstall()
    assert _snapshot(etc) == {"config.toml": CONTAINERD.encode()}


def test_an_older_runtime_configure_record_is_undone_by_runtime_unconfigure(tmp_path):
    etc, config = _configured_by_ctk(tmp_path)
    _as_version_1(etc / "config.toml.nvct-undo")
    runtimes.unconfigure("containerd", str(config))
    assert _snapshot(etc) == {"config.toml": CONTAINERD.encode()}
