"""How each engine's daemon learns of the change (--restart-mode), without root or real daemons.

docker's reload is checked against :mod:`tests.toolkit.fake_dockerd`, which
keeps ``runtimes``/``default-runtime`` that a reloaded file leaves out, as
dockerd 20.10 does; systemd against a fake ``systemctl`` on PATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nvct.base.errors import ConfigError
from nvct.toolkit import Installation, Options, daemons
from nvct.toolkit.daemons import DaemonError

FAKE_DOCKERD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_dockerd.py")
OURS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}


class FakeDockerd:
    def __init__(self, tmp_path, config: dict | None):
        self.config = str(tmp_path / "daemon.json")
        self.socket = str(tmp_path / "docker.sock")
        if config is not None:
            with open(self.config, "w") as f:
                json.dump(config, f, indent=2)
        self.proc = subprocess.Popen([sys.executable, FAKE_DOCKERD, self.socket, self.config],
                                     stdout=subprocess.PIPE)
        assert self.proc.stdout.readline() == b"ready\n"

    def info(self) -> tuple[set, str]:
        info = daemons.docker_info(self.socket)
        return set(info["Runtimes"]), info["DefaultRuntime"]

    def read(self) -> bytes | None:
        try:
            with open(self.config, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def fake_dockerd(tmp_path):
    started = []

    def start(config: dict | None = None) -> FakeDockerd:
        started.append(FakeDockerd(tmp_path, config))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def _options(tmp_path, **kwargs) -> Options:
    kwargs.setdefault("signal_backoff", 0)
    kwargs.setdefault("pid_file", str(tmp_path / "run" / "toolkit.pid"))  # the restart markers go beside it
    return Options(install_dir=str(tmp_path / "install"), driver_root="/", python=sys.executable, host_root="/",
                   reload_timeout=5, **kwargs)


def _install(opts: Options):
    log = []
    inst = Installation(opts, log.append)
    inst.install()
    return inst, log


DAEMON_JSON = {"storage-driver": "vfs", "log-level": "warn"}


def test_docker_signal_reload_adds_the_runtimes_and_removal_leaves_dockerd_on_runc(tmp_path, fake_dockerd):
    daemon = fake_dockerd(DAEMON_JSON)
    before = daemon.read()
    inst, log = _install(_options(tmp_path, runtime="docker", config=daemon.config, socket=daemon.socket))
    names, default = daemon.info()
    assert OURS <= names and default == "nvidia"
    assert f"sent SIGHUP to docker (pid {daemon.proc.pid}, found through {daemon.socket})" in log

    inst.uninstall()
    names, default = daemon.info()
    assert not names & OURS and default == "runc"  # not "panic": no default on a runtime that is gone
    assert daemon.read() == before
    assert sorted(os.listdir(tmp_path)) == ["daemon.json", "docker.sock", "install"]
    assert any("made explicit" in line for line in log)


def test_without_the_explicit_reload_dockerd_would_keep_the_gone_default(tmp_path, fake_dockerd):
    """What the interim reload prevents (the fake behaves as dockerd 20.10)."""
    from nvct import engines as runtimes

    daemon = fake_dockerd(DAEMON_JSON)
    runtimes.configure("docker", daemon.config, {"nvidia": "/x/nvidia-container-runtime"}, set_default="nvidia")
    os.kill(daemon.proc.pid, 1)
    assert daemon.info() == ({"runc", "nvidia"}, "nvidia")
    runtimes.unconfigure("docker", daemon.config)
    os.kill(daemon.proc.pid, 1)
    assert daemon.info() == ({"runc", "nvidia"}, "nvidia")


def test_a_daemon_json_naming_its_runtimes_and_default_is_reloaded_as_it_is(tmp_path, fake_dockerd):
    daemon = fake_dockerd({"runtimes": {"crun": {"path": "/usr/bin/crun"}}, "default-runtime": "crun"})
    before = daemon.read()
    inst, log = _install(_options(tmp_path, runtime="docker", config=daemon.config, socket=daemon.socket,
                                  set_as_default=False))
    assert daemon.info() == ({"runc", "crun"} | OURS, "crun")
    inst.uninstall()
    assert daemon.info() == ({"runc", "crun"}, "crun")
    assert daemon.read() == before
    assert not any("made explicit" in line for line in log)


def test_a_missing_daemon_json_is_created_and_removed_again(tmp_path, fake_dockerd):
    daemon = fake_dockerd(None)
    inst, _ = _install(_options(tmp_path, runtime="docker", config=daemon.config, socket=daemon.socket))
    assert daemon.info()[1] == "nvidia"
    inst.uninstall()
    assert daemon.read() is None
    assert daemon.info() == ({"runc"}, "runc")


def test_restart_mode_none_leaves_the_daemon_alone(tmp_path, fake_dockerd):
    daemon = fake_dockerd(DAEMON_JSON)
    inst, log = _install(_options(tmp_path, runtime="docker", config=daemon.config, socket=daemon.socket,
                                  restart_mode="none"))
    assert daemon.info() == ({"runc"}, "runc")
    assert any("not restarting docker (--restart-mode=none)" in line for line in log)
    inst.uninstall()


def test_an_unreachable_dockerd_fails_the_install_and_undoes_it(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text('{"storage-driver": "vfs"}\n')
    opts = _options(tmp_path, runtime="docker", config=str(config), socket=str(tmp_path / "none.sock"),
                    signal_attempts=2)
    log = []
    with pytest.raises(DaemonError, match=f"cannot signal docker: {tmp_path}/none.sock: cannot connect"):
        Installation(opts, log.append).install()
    assert config.read_text() == '{"storage-driver": "vfs"}\n'
    assert sorted(os.listdir(tmp_path)) == ["daemon.json", "install"]
    assert os.listdir(tmp_path / "install") == []
    assert any("attempt 1/2" in line for line in log)


def test_containerd_in_signal_mode_is_told_to_restart_not_signalled(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    inst, log = _install(_options(tmp_path, runtime="containerd", config=str(config),
                                  socket=str(tmp_path / "none.sock"), config_sources=["file"]))
    assert any("containerd does not reload its config on SIGHUP: restart containerd" in line for line in log)
    inst.uninstall()
    assert config.read_text() == "version = 2\n"


def test_crio_restarts_through_systemd_at_install_and_removal(tmp_path, fake_systemctl):
    config = tmp_path / "crio.conf"
    config.write_text('[crio.runtime]\ndefault_runtime = "crun"\n')
    inst, log = _install(_options(tmp_path, runtime="crio", config=str(config), config_sources=["file"]))
    assert fake_systemctl.read_text() == "restart crio\n"
    assert "restarted crio: systemctl restart crio" in log
    inst.uninstall()
    assert fake_systemctl.read_text() == "restart crio\nrestart crio\n"
    assert config.read_text() == '[crio.runtime]\ndefault_runtime = "crun"\n'


def test_crio_cannot_be_signalled():
    with pytest.raises(ConfigError, match="--restart-mode=signal: cri-o cannot be reloaded by a signal"):
        Options(runtime="crio", restart_mode="signal").resolved()


def test_docker_systemd_restart_is_followed_by_waiting_for_the_api(tmp_path, fake_dockerd, monkeypatch):
    daemon = fake_dockerd(DAEMON_JSON)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f"#!/bin/sh\nkill -USR1 {daemon.proc.pid}\n")  # the fake's restart
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")
    inst, log = _install(_options(tmp_path, runtime="docker", config=daemon.config, socket=daemon.socket,
                                  restart_mode="systemd"))
    assert "restarted docker: systemctl restart docker" in log
    assert any(line.startswith("dockerd applied") and line.endswith("default nvidia") for line in log)
    inst.uninstall()
    assert daemon.info() == ({"runc"}, "runc")


def test_a_refused_pid_is_not_retried(tmp_path, monkeypatch):
    config = tmp_path / "daemon.json"
    config.write_text("{}\n")
    monkeypatch.setattr(daemons, "peer_credentials", lambda path: (1, 0, 0))
    opts = _options(tmp_path, runtime="docker", config=str(config), socket=str(tmp_path / "docker.sock"),
                    signal_attempts=6, signal_backoff=30)
    log = []
    with pytest.raises(DaemonError, match="cannot signal docker: .*served by pid 1"):
        Installation(opts, log.append).install()
    assert not any("attempt" in line for line in log)
    assert config.read_text() == "{}\n"
