"""The installer's whole life against a real dockerd on a simulated GPU node.

Install (the toolkit, daemon.json, SIGHUP to dockerd found through its
socket) -> a GPU container through the installed ``nvidia`` runtime ->
SIGTERM -> everything removed, daemon.json byte-identical, and dockerd left
on runc (not on a default runtime that no longer exists).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e.conftest import expected_nodes
from tests.support.fixtures import BUSYBOX_IMAGE, need_binaries, need_root
from tests.support.proc import wait_for
from tests.toolkit.installer import Installer, node_flags

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


@pytest.fixture(scope="module")
def dockerd(busybox_image_tar):
    need_root("runs dockerd")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker", "/usr/sbin/runc", "/usr/bin/python3")
    from tests.support.docker import Dockerd

    with Dockerd() as daemon:
        daemon.load(busybox_image_tar)
        yield daemon


def _info(dockerd) -> tuple[set, str]:
    out = dockerd.docker(["info", "--format", "{{json .Runtimes}} {{json .DefaultRuntime}}"]).check().stdout
    names, _, default = out.strip().partition(" ")
    return set(json.loads(names)), json.loads(default)


def _reloads(dockerd) -> int:
    """How many SIGHUPs dockerd has handled, by its log (a reload that panics ends the process instead)."""
    with open(dockerd.log_path, errors="replace") as f:
        log = f.read()
    return log.count("Reloaded configuration: ") + log.count("Error reconfiguring the daemon: ")


def test_installer_life_with_dockerd(dockerd, sim_node, tmp_path):
    with open(dockerd.config_file, "rb") as f:
        before = f.read()
    listing = sorted(os.listdir(os.path.dirname(dockerd.config_file)))
    installer = Installer(["--runtime", "docker", "--config", dockerd.config_file, "--socket", dockerd.socket,
                           *node_flags(sim_node)], tmp_path)

    with installer:
        assert "sent SIGHUP to docker (pid %d" % dockerd.pid in installer.log()
        names, default = _info(dockerd)
        assert {"nvidia", "nvidia-cdi", "nvidia-legacy"} <= names and default == "nvidia"
        config = json.loads(open(dockerd.config_file).read())
        assert config["runtimes"]["nvidia"]["path"] == os.path.join(installer.toolkit, "nvidia-container-runtime")

        started = time.monotonic()
        result = dockerd.run(["--rm", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0", BUSYBOX_IMAGE,
                              "sh", "-c", PROBE])
        first_run = time.monotonic() - started
        assert result.rc == 0, result.describe() + installer.log()
        assert {ln for ln in result.stdout.splitlines() if ln.startswith("/dev/")} == expected_nodes(sim_node, [0])
        assert "ok libcuda.so.1" in result.stdout
        assert f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][0]['uuid']})" in result.stdout

        # nvidia-legacy: the shim adds the installed hook, which injects the GPU from inside runc's create.
        legacy = dockerd.run(["--rm", "--runtime=nvidia-legacy", "-e", "NVIDIA_VISIBLE_DEVICES=1", BUSYBOX_IMAGE,
                              "sh", "-c", PROBE])
        assert legacy.rc == 0, legacy.describe() + installer.log()
        assert {ln for ln in legacy.stdout.splitlines() if ln.startswith("/dev/")} == expected_nodes(sim_node, [1])
        assert "ok libcuda.so.1" in legacy.stdout

        # The default runtime is nvidia now: a container asking for nothing passes straight through.
        plain = dockerd.run(["--rm", BUSYBOX_IMAGE, "sh", "-c", "ls /dev | grep -c nvidia; true"])
        assert plain.rc == 0 and plain.stdout.strip() == "0", plain.describe()

        started = time.monotonic()
        assert installer.stop(signal.SIGTERM) == 0, installer.log()
        cleanup = time.monotonic() - started

    with open(dockerd.config_file, "rb") as f:
        assert f.read() == before
    assert sorted(os.listdir(os.path.dirname(dockerd.config_file))) == listing
    assert not os.path.exists(installer.toolkit)
    assert not os.path.exists(installer.pid_file)
    names, default = _info(dockerd)
    assert not names & {"nvidia", "nvidia-cdi", "nvidia-legacy"} and default == "runc", installer.log()
    # dockerd 20.10 panics at a reload whose runtimes lack the default it kept: it must not have kept one.
    reloads = _reloads(dockerd)
    os.kill(dockerd.pid, signal.SIGHUP)
    wait_for(lambda: _reloads(dockerd) > reloads or dockerd._proc.poll() is not None, "dockerd's reload",
             detail=dockerd.log_tail)
    assert dockerd.run(["--rm", BUSYBOX_IMAGE, "true"]).rc == 0, dockerd.log_tail()
    print(f"\ninstaller ready after {installer.ready_after:.2f}s; first GPU container {first_run:.2f}s; "
          f"SIGTERM to exit {cleanup:.2f}s")
