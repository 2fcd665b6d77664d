"""Day two on a node, as one operator did it (issue 23): real containerd 1.6 and dockerd, real runc.

containerd: ``nvidia-ctk runtime configure`` -> an installer that fails on its restart (no
systemd on the host) -> the earlier drop-in is still there byte for byte -> an installer with
``RUNTIME_RESTART_MODE`` set succeeds -> a GPU container runs (``ctr run -d``) -> the installer
gets SIGTERM -> ``ctr task kill`` and ``ctr task rm`` still work -> the node is as after the first
step. docker: a GPU container started before the installer's SIGTERM is stopped and removed
after it. The runtime path the engines recorded is kept working by a stand-in until the last
container that names it is deleted (:mod:`nvct.toolkit.standin`).
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess

import pytest

from tests.support.containerd import CONTAINERD, CTR, RUNC
from tests.support.fixtures import BUSYBOX_IMAGE, BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_root
from tests.support.proc import wait_for
from tests.toolkit.installer import VENV_BIN, Installer, node_flags
from tests.toolkit.test_e2e_containerd import RestartableContainerd

pytestmark = pytest.mark.containers

NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")


@pytest.fixture(scope="module")
def containerd(busybox_image_tar):
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    with RestartableContainerd() as daemon:
        daemon.import_image(busybox_image_tar)
        yield daemon


def _engine_files(containerd) -> dict:
    """config.toml, its drop-ins, nvct's record and backup: what configure and the installer touch."""
    out = {}
    base = os.path.dirname(containerd.config_file)
    for path in glob.glob(containerd.config_file + "*") + glob.glob(os.path.join(base, "conf.d", "*")):
        with open(path, "rb") as f:
            out[os.path.relpath(path, base)] = f.read()
    return out


def _no_systemd(tmp_path) -> str:
    """A directory with a ``systemctl`` that answers as on a host without systemd."""
    bindir = tmp_path / "no-systemd"
    bindir.mkdir()
    (bindir / "systemctl").write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{NO_SYSTEMD}EOF\nexit 1\n")
    (bindir / "systemctl").chmod(0o755)
    return str(bindir)


def _wait_stopped(containerd, cid: str, timeout: float = 30) -> None:
    def stopped() -> bool:
        tasks = containerd.ctr(["task", "ls"]).check().stdout
        return "STOPPED" in next((ln for ln in tasks.splitlines() if ln.split()[:1] == [cid]), "")

    wait_for(stopped, f"{cid} stopped", timeout, detail=lambda: containerd.ctr(["task", "ls"]).stdout)


def test_the_operators_day_two_with_containerd(containerd, sim_node, tmp_path):
    config = containerd.config_file
    # 1. nvidia-ctk runtime configure --runtime=containerd
    # nvct's list of configured engine configs is private to this test (a package purge on this
    # machine meanwhile would undo them: what package removal is for)
    state = {"NVCT_STATE_DIR": str(tmp_path / "state")}
    subprocess.run([os.path.join(VENV_BIN, "nvidia-ctk"), "runtime", "configure", "--runtime=containerd",
                    f"--config={config}"], check=True, capture_output=True, env={**os.environ, **state})
    containerd.restart()
    step1 = _engine_files(containerd)
    assert "conf.d/99-nvidia.toml" in step1

    # 2. the installer fails on its restart: no systemd on this host
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    flags = ["--runtime", "containerd", "--config", config, "--socket", containerd.socket, *node_flags(sim_node)]
    failing = Installer(flags, tmp_path / "first", env={
        "PATH": f"{_no_systemd(tmp_path)}:/usr/sbin:/usr/bin:/sbin:/bin", "RUNTIME_RESTART_MODE": "systemd",
        **state})
    proc = subprocess.run(failing.argv, env=failing.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "nvct: systemctl restart containerd: exit status 1: Failed to connect to bus: Host is down; no systemd "
        "runs on the host: set RUNTIME_RESTART_MODE=none (--restart-mode=none) and restart containerd yourself")

    # 3. the earlier drop-in (and everything beside it) is still there, byte for byte
    assert _engine_files(containerd) == step1
    assert not os.path.exists(failing.toolkit)

    # 4. the installer succeeds with RUNTIME_RESTART_MODE set; containerd is restarted as it says
    installer = Installer(flags, tmp_path / "second", env={"RUNTIME_RESTART_MODE": "none", **state})
    with installer:
        containerd.restart()
        # 5. GPU containers run, through the installed runtime
        runtime = os.path.join(installer.toolkit, "nvidia-container-runtime")
        cids = ["gpu-day-two", "gpu-day-two-b"]
        for cid in cids:
            containerd.ctr(["run", "-d", "--runc-binary", runtime, "--env", "NVIDIA_VISIBLE_DEVICES=0",
                            BUSYBOX_IMAGE_QUALIFIED, cid, "sleep", "3600"]).check()
        seen = containerd.ctr(["task", "exec", "--exec-id", "probe", cids[0], "sh", "-c",
                               "ls /dev/nvidia0 && nvidia-smi -L"]).check()
        assert f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][0]['uuid']})" in seen.stdout, seen.describe()

        # 6. the installer gets SIGTERM
        assert installer.stop(signal.SIGTERM) == 0, installer.log()
    assert f"left a stand-in at {runtime}" in installer.log()
    assert "removed everything that was installed, but 1 stand-in(s) for running containers" in installer.log()
    assert os.listdir(installer.toolkit) == ["nvidia-container-runtime"]
    # a new container cannot be started on the stand-in: one line says why
    refused = containerd.ctr(["run", "--rm", "--runc-binary", runtime, BUSYBOX_IMAGE_QUALIFIED, "refused", "true"])
    assert not refused.ok and "nvct was removed from this node; this stand-in only stops and deletes" in \
        refused.stderr, refused.describe()

    # 7. the containers can still be stopped and deleted; the stand-in stays while one still names it
    for cid in cids:
        assert os.path.exists(runtime)
        containerd.ctr(["task", "kill", "-s", "KILL", cid]).check()
        _wait_stopped(containerd, cid)
        containerd.ctr(["task", "rm", cid]).check()
        containerd.ctr(["container", "rm", cid]).check()

    # 8. the node is back to step 1's state: the stand-in went with the last container
    assert _engine_files(containerd) == step1
    assert not os.path.exists(installer.toolkit)


@pytest.fixture(scope="module")
def dockerd(busybox_image_tar):
    need_root("runs dockerd")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker", "/usr/sbin/runc")
    from tests.support.docker import Dockerd

    with Dockerd() as daemon:
        daemon.load(busybox_image_tar)
        yield daemon


def test_a_gpu_container_outlives_the_installer_under_docker(dockerd, sim_node, tmp_path):
    installer = Installer(["--runtime", "docker", "--config", dockerd.config_file, "--socket", dockerd.socket,
                           *node_flags(sim_node)], tmp_path, env={"NVCT_STATE_DIR": str(tmp_path / "state")})
    with installer:
        started = dockerd.docker(["run", "-d", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0", BUSYBOX_IMAGE,
                                  "sh", "-c", "ls /dev/nvidia0 && exec sleep 3600"]).check()
        cid = started.stdout.strip()
        assert installer.stop(signal.SIGTERM) == 0, installer.log()
    runtime = os.path.join(installer.toolkit, "nvidia-container-runtime")
    assert f"left a stand-in at {runtime}" in installer.log()
    assert dockerd.docker(["logs", cid]).stdout == "/dev/nvidia0\n"
    # docker kill goes through the runtime the shim recorded (docker stop would fall back to a
    # direct SIGKILL after its timeout, and its rm then leaves the task and runc's state behind)
    dockerd.docker(["kill", cid]).check()
    wait_for(lambda: dockerd.docker(["inspect", "-f", "{{.State.Running}}", cid]).check().stdout.strip() == "false",
             f"docker kill stopped {cid}", 20, detail=dockerd.log_tail)
    dockerd.docker(["rm", cid]).check()
    assert not os.path.exists(os.path.join(dockerd.exec_root, "runtime-runc", "moby", cid)), dockerd.log_tail()
    assert not os.path.exists(installer.toolkit)  # the stand-in went with its last container
