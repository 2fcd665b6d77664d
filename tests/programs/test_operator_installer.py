"""The GPU Operator's toolkit DaemonSet, with nvct's image: its entry programs and env vars on a real containerd.

The operator runs ``nvidia-ctk-installer`` (newer releases) or ``nvidia-toolkit
/usr/local/nvidia`` (older ones, from its entrypoint script) configured only by
environment variables. containerd >= 1.6.9 sends SIGTERM to the installer
right after the restart it asked for: here the fake ``systemctl`` restarts
the private containerd, then signals its caller. The installer must leave
its work in place, and the one the kubelet starts next must not restart
containerd again (no loop). A later SIGTERM is an uninstall as usual.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.e2e.conftest import VENV_BIN, expected_nodes
from tests.support.containerd import CONTAINERD, CTR, K8S_NAMESPACE, RUNC
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_module, need_root
from tests.toolkit.installer import Installer
from tests.toolkit.test_e2e_containerd import RestartableContainerd

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


class FakeSystemd:
    """``systemctl restart containerd`` restarts the private containerd, then SIGTERMs its caller."""

    def __init__(self, tmp, containerd):
        self.containerd = containerd
        self.bindir = tmp / "bin"
        self.bindir.mkdir()
        self.record = tmp / "systemctl.argv"
        self.asked, self.done = tmp / "restart.asked", tmp / "restart.done"
        script = self.bindir / "systemctl"
        script.write_text(
            "#!/bin/sh\n"
            f'echo "$@" >> {self.record}\n'
            f'rm -f {self.done}; touch {self.asked}\n'
            f'while [ ! -e {self.done} ]; do sleep 0.05; done\n'
            f'rm -f {self.asked}\n'
            '[ -n "$SIGTERM_CALLER" ] && kill -TERM $PPID\n'
            "exit 0\n")
        script.chmod(0o755)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self._stop.is_set():
            if self.asked.exists() and not self.done.exists():
                self.containerd.restart()
                self.done.touch()
            self._stop.wait(0.05)  # polls for the request file until stopped

    def restarts(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture
def containerd(busybox_image_tar, pause_image_tar):
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    need_module("grpc", "python3-grpcio, the CRI client")
    with RestartableContainerd() as daemon:
        for tar in (busybox_image_tar, pause_image_tar):
            daemon.import_image(tar, K8S_NAMESPACE)
        yield daemon


def operator_env(installer: Installer, containerd, sim_node, systemd: FakeSystemd, **extra) -> dict:
    """What the operator's DaemonSet (and its ClusterPolicy defaults) set, with this node's paths."""
    roots = sim_node["roots"]
    return {
        "PATH": f"{systemd.bindir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "ROOT": installer.install_dir,
        "TOOLKIT_PID_FILE": installer.pid_file,
        "RUNTIME": "containerd",
        "CONTAINERD_CONFIG": containerd.config_file,
        "CONTAINERD_SOCKET": containerd.socket,
        "CONTAINERD_RUNTIME_CLASS": "nvidia",
        "CONTAINERD_SET_AS_DEFAULT": "true",
        "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND": "management.nvidia.com/gpu",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "NVIDIA_DRIVER_ROOT": roots["driver_root"],
        "DRIVER_ROOT_CTR_PATH": roots["driver_root"],
        "NVIDIA_DEV_ROOT": roots["dev_root"],
        "NVCT_PROC_ROOT": roots["proc_root"],
        "HOST_ROOT_MOUNT": "/",
        # The entry programs keep the reference's default (signal, which containerd ignores): the
        # restart through the host's systemd is asked for, as a ClusterPolicy's toolkit env does.
        "RUNTIME_RESTART_MODE": "systemd",
        **extra,
    }


@pytest.mark.parametrize("program", [["nvidia-ctk-installer"], ["nvidia-toolkit", "ROOT"]])
def test_sigterm_right_after_the_restart_keeps_the_install_and_no_loop(containerd, sim_node, tmp_path, program):
    with FakeSystemd(tmp_path, containerd) as systemd:
        workdir = tmp_path / "node"
        workdir.mkdir()
        argv = [os.path.join(VENV_BIN, program[0])] + [str(workdir / "install") if a == "ROOT" else a
                                                       for a in program[1:]]
        first = Installer([], workdir, program=argv)
        first.env = operator_env(first, containerd, sim_node, systemd, SIGTERM_CALLER="1")
        first.start()
        assert first.proc.wait(60) == 0, first.log()
        assert "taken for the restart's side effect" in first.log(), first.log()
        assert systemd.restarts() == ["restart containerd"]
        drop_in = os.path.join(containerd.state_dir, "conf.d", "99-nvidia.toml")
        assert os.path.exists(drop_in) and os.path.isdir(first.toolkit), first.log()

        # the kubelet starts the installer again: same config, containerd already restarted for it
        (tmp_path / "again").mkdir()
        second = Installer([], tmp_path / "again", program=argv)  # its own log; the same node paths
        second.env = operator_env(first, containerd, sim_node, systemd)
        with second:
            assert "not restarting it" in second.log(), second.log()
            assert systemd.restarts() == ["restart containerd"]
            result = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], runtime_handler="nvidia",
                                        env={"NVIDIA_VISIBLE_DEVICES": "0"})
            assert result.rc == 0, result.describe() + second.log()
            assert {ln for ln in result.stdout.splitlines() if ln.startswith("/dev/")} == expected_nodes(sim_node, [0])
            assert "ok libcuda.so.1" in result.stdout
            for tool in ("nvidia-cdi-hook", "nvidia-ctk", "nvidia-container-cli", "nvidia-container-runtime",
                         "nvidia-container-runtime-hook"):
                assert os.access(os.path.join(first.toolkit, tool), os.X_OK), tool
            # a real uninstall (this installer restarted nothing, so no grace applies): undone
            assert second.stop(signal.SIGTERM) == 0, second.log()
        assert "removing what was installed" in second.log(), second.log()
        assert systemd.restarts() == ["restart containerd", "restart containerd"]
        assert not os.path.exists(drop_in)
