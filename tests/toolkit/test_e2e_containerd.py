"""The installer's whole life against a real containerd 1.6 (CRI) on a simulated GPU node.

containerd reads its config only at start (it ignores SIGHUP), so the
installer says so and the test restarts it, as an operator or systemd
(``--restart-mode=systemd``) would. A pod through the CRI API with runtime
handler ``nvidia`` and ``NVIDIA_VISIBLE_DEVICES=0`` gets its GPU; after
SIGTERM the config is byte-identical and the drop-in is gone.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.conftest import expected_nodes
from tests.support.containerd import CONTAINERD, CTR, K8S_NAMESPACE, RUNC, Containerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_module, need_root
from tests.support.proc import read_pidfile, start_daemon, stop_pid, wait_for
from tests.toolkit.installer import Installer, node_flags

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"


class RestartableContainerd(Containerd):
    """A private containerd that can be restarted on the config files as they are now."""

    def restart(self, timeout: float = 60) -> None:
        if self._cri is not None:
            self._cri.close()
            self._cri = None
        stop_pid(self._proc.pid, timeout=20)
        self._proc.wait()
        self._proc = start_daemon(
            ["/bin/sh", "-c", 'echo $$ > "$1"; exec "$2" --config "$3"', "sh",
             self.pidfile, CONTAINERD, self.config_file], env=self.env, log_path=self.log_path)
        wait_for(lambda: self._proc.poll() is not None or self.ctr(["version"], timeout=10).ok,
                 "containerd ready", timeout, detail=self.log_tail)
        assert self._proc.poll() is None, f"containerd exited: {self.log_tail()}"
        self.pid = read_pidfile(self.pidfile)


@pytest.fixture(scope="module")
def containerd(busybox_image_tar, pause_image_tar):
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC, "/usr/bin/python3")
    need_module("grpc", "python3-grpcio, the CRI client")
    with RestartableContainerd() as daemon:
        for tar in (busybox_image_tar, pause_image_tar):
            daemon.import_image(tar, K8S_NAMESPACE)
        yield daemon


def test_installer_life_with_containerd(containerd, sim_node, tmp_path):
    with open(containerd.config_file, "rb") as f:
        before = f.read()
    state_listing = sorted(os.listdir(containerd.state_dir))
    drop_in = os.path.join(containerd.state_dir, "conf.d", "99-nvidia.toml")
    installer = Installer(["--runtime", "containerd", "--config", containerd.config_file,
                           "--socket", containerd.socket, *node_flags(sim_node)], tmp_path)

    with installer:
        assert "containerd does not reload its config on SIGHUP: restart containerd" in installer.log()
        with open(drop_in) as f:
            text = f.read()
        for name, suffix in (("nvidia", ""), ("nvidia-cdi", ".cdi"), ("nvidia-legacy", ".legacy")):
            assert f'BinaryName = "{installer.toolkit}/nvidia-container-runtime{suffix}"' in text, text
            assert f"runtimes.{name}]" in text
        assert 'default_runtime_name = "nvidia"' in text

        containerd.restart()
        started = time.monotonic()
        result = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], runtime_handler="nvidia",
                                    env={"NVIDIA_VISIBLE_DEVICES": "0"})
        first_pod = time.monotonic() - started
        assert result.rc == 0, result.describe() + installer.log()
        assert {ln for ln in result.stdout.splitlines() if ln.startswith("/dev/")} == expected_nodes(sim_node, [0])
        assert "ok libcuda.so.1" in result.stdout
        assert f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][0]['uuid']})" in result.stdout

        assert installer.stop(signal.SIGTERM) == 0, installer.log()

    with open(containerd.config_file, "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.dirname(drop_in))
    assert sorted(os.listdir(containerd.state_dir)) == state_listing
    assert not os.path.exists(installer.toolkit)
    assert not os.path.exists(installer.pid_file)
    containerd.restart()
    plain = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", "ls /dev | grep -c nvidia; true"])
    assert plain.rc == 0 and plain.stdout.strip() == "0", plain.describe()
    print(f"\ninstaller ready after {installer.ready_after:.2f}s; first GPU pod {first_pod:.2f}s")
