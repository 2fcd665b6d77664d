"""The installer's life as a process: ready, then SIGTERM/SIGINT undo everything it did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from nvct.toolkit import StopSignals
from tests.toolkit.installer import Installer

CONTAINERD_CONFIG = ('# the node\'s own config\nversion = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n'
                     '  sandbox_image = "pause"\n')


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_undoes_the_installation(tmp_path, sig):
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    config.write_text(CONTAINERD_CONFIG)
    installer = Installer(["--runtime", "containerd", "--config", str(config), "--restart-mode", "none",
                           "--config-source", "file", "--driver-root", "/", "--python", sys.executable], tmp_path)
    with installer:
        assert os.path.isfile(os.path.join(installer.toolkit, "nvidia-container-runtime"))
        assert (tmp_path / "etc" / "conf.d" / "99-nvidia.toml").is_file()
        assert open(installer.pid_file).read() == f"{installer.proc.pid}\n"
        assert installer.stop(sig) == 0, installer.log()
    assert config.read_text() == CONTAINERD_CONFIG
    assert sorted(os.listdir(tmp_path / "etc")) == ["config.toml"]
    assert not os.path.exists(installer.toolkit)
    assert not os.path.exists(installer.pid_file)
    assert f"{signal.Signals(sig).name}: removing what was installed" in installer.log()


def test_no_daemon_installs_and_exits_undoing_nothing(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_CONFIG)
    installer = Installer(["--runtime", "containerd", "--config", str(config), "--restart-mode", "none",
                           "--config-source", "file", "--driver-root", "/", "--python", sys.executable,
                           "--no-daemon"], tmp_path)
    with open(installer.log_path, "ab") as log:
        rc = subprocess.run(installer.argv, env=installer.env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=60).returncode
    assert rc == 0, installer.log()
    assert "nvidia-container-runtime" in (tmp_path / "conf.d" / "99-nvidia.toml").read_text()
    assert os.path.isdir(installer.toolkit)
    assert not os.path.exists(installer.pid_file)


def test_stop_signals_wait_returns_a_signal_that_came_before():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        assert stop.requested()
        assert stop.wait() == signal.SIGHUP


def test_stop_signals_wait_blocks_until_one_comes():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        assert stop.wait() == signal.SIGTERM
        timer.join()
    assert signal.getsignal(signal.SIGTERM) == before
