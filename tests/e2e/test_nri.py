"""The GPU Operator's NRI mode, for real: containerd 2.1 (node root) with NRI on, nvct's installer as its plugin.

The installer runs as the operator's DaemonSet runs it in that mode
(``ENABLE_NRI_PLUGIN``, ``NRI_SOCKET``, ``NRI_PLUGIN_INDEX``,
``NRI_NAMESPACE``, ``NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES``): it writes no
containerd config and registers with containerd's NRI socket. CRI pods run
through containerd's own runc handler; the pod annotation
``nvidia.cdi.k8s.io/container.<name>`` names CDI devices of the specs
``nvct cdi generate`` wrote (in containerd's ``cdi_spec_dirs``), and the
container sees exactly those. A management device is refused outside the
allowed namespaces. After containerd restarts, the plugin registers again.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.e2e.conftest import expected_nodes
from tests.support.cri import CriError, PodConfig, read_cri_log
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, K8S_NAMESPACE
from tests.support.noderoot import CRI_RUNTIME, SCRIPTS, NodeContainerd, NodeRoot, entered_node_root
from tests.support.proc import Result, stop_pid, unique_id, wait_for
from tests.toolkit.installer import VENV_BIN, Installer

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L; true"
OPERATOR_NS = "gpu-operator"
MONITORING_NS = "dcgm"
ANNOTATION = "nvidia.cdi.k8s.io/container.app"


@pytest.fixture(scope="module")
def node():
    with entered_node_root() as n:
        yield n


class NriContainerd(NodeContainerd):
    """containerd 2.1 with NRI on, reading CDI specs from ``cdi_dir`` only."""

    def __init__(self, node: NodeRoot, cdi_dir: str, **kwargs) -> None:
        super().__init__(node, config_version=3, nri=True, **kwargs)
        self.cdi_dir = cdi_dir

    def config(self) -> dict:
        config = super().config()
        config["plugins"][CRI_RUNTIME]["cdi_spec_dirs"] = [self.cdi_dir]
        return config

    def restart(self) -> None:
        """Kill containerd and start it again on the same state (what an upgrade or a crash does)."""
        stop_pid(self._proc.pid, timeout=20)
        self._proc.wait()
        if self._cri is not None:
            self._cri.close()
            self._cri = None
        self._start(60)


@pytest.fixture(scope="module")
def nri(node, sim_node, busybox_image_tar, pause_image_tar, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nri")
    cdi_dir = tmp / "cdi"
    cdi_dir.mkdir()
    for mode, vendor in (("nvml", "nvidia.com"), ("management", "management.nvidia.com")):
        generated = node.nvct("cdi", "generate", "--mode", mode, "--vendor", vendor,
                              "--hook-path", os.path.join(SCRIPTS, "nvct"), "--output", str(cdi_dir / f"{vendor}.yaml"),
                              env={"NVCT_STATE_DIR": os.environ["NVCT_STATE_DIR"],
                                   "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]})
        assert generated.ok, generated.describe()
    with NriContainerd(node, str(cdi_dir)) as daemon:
        daemon.import_image(busybox_image_tar, K8S_NAMESPACE)
        daemon.import_image(pause_image_tar, K8S_NAMESPACE)
        config_before = open(daemon.config_file).read()
        work = tmp / "installer"
        work.mkdir()
        env = {"ENABLE_NRI_PLUGIN": "true", "NRI_SOCKET": daemon.nri_socket, "NRI_PLUGIN_INDEX": "7",
               "NRI_NAMESPACE": OPERATOR_NS, "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES": MONITORING_NS,
               "RUNTIME": "containerd", "RUNTIME_CONFIG": daemon.config_file, "RUNTIME_SOCKET": daemon.socket,
               "RUNTIME_CONFIG_SOURCE": f"file={daemon.config_file}",
               "ROOT": str(work / "install"), "TOOLKIT_PID_FILE": str(work / "run" / "toolkit.pid"),
               "HOST_ROOT_MOUNT": "/", "NVCT_HOST_PYTHON": sys.executable, "NVIDIA_DRIVER_ROOT": "/",
               "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]}
        # as the operator's DaemonSet runs it: the entry program, configured by environment variables alone
        with Installer([], str(work), env=env, program=[os.path.join(VENV_BIN, "nvidia-ctk-installer")]) as inst:
            daemon.installer = inst
            daemon.config_before = config_before
            yield daemon
            assert inst.stop() == 0, inst.log()  # SIGTERM: the plugin stops, the toolkit is removed
            assert "removed everything that was installed" in inst.log(), inst.log()


def run_pod(daemon, namespace: str, annotations: dict, command: str = PROBE) -> Result:
    """One pod in ``namespace`` (its annotations as given), one container ``app`` running ``command``."""
    cri = daemon.cri
    logs = os.path.join(daemon.pod_logs, unique_id("logs"))
    os.makedirs(logs)
    pod = PodConfig(name=unique_id("pod"), log_directory=logs, namespace=namespace, annotations=annotations)
    pod_id = cri.run_pod_sandbox(pod)
    try:
        cid = cri.create_container(pod_id, pod, "app", BUSYBOX_IMAGE_QUALIFIED, command=["sh", "-c", command],
                                   log_path="app.log")
        cri.start_container(cid)
        status = cri.wait_exited(cid, 60)
        stdout, stderr = read_cri_log(os.path.join(logs, "app.log"))
        return Result(rc=-1 if status is None else status.exit_code, stdout=stdout, stderr=stderr,
                      argv=[command])
    finally:
        cri.stop_pod_sandbox(pod_id)
        cri.remove_pod_sandbox(pod_id)


def nodes(result: Result) -> set:
    return {line for line in result.stdout.splitlines() if line.startswith("/dev/")}


def test_the_installer_registers_and_writes_no_containerd_config(nri):
    log = nri.installer.log()
    assert "NRI: registered as 07-nvidia-ctk-installer" in log, log  # the reference's name: its program's
    assert open(nri.config_file).read() == nri.config_before
    assert sorted(os.listdir(nri.state_dir)).count("conf.d") == 0


@pytest.mark.parametrize("gpu", [0, 1])
def test_the_annotation_gives_the_container_exactly_the_named_device(nri, sim_node, gpu):
    result = run_pod(nri, "default", {ANNOTATION: f"nvidia.com/gpu={gpu}"})
    assert result.rc == 0, result.describe() + nri.log_tail() + nri.installer.log()
    assert nodes(result) == expected_nodes(sim_node, [gpu]), result.stdout
    assert "ok libcuda.so.1" in result.stdout
    assert f"(UUID: {sim_node['gpus'][gpu]['uuid']})" in result.stdout


def test_two_devices_by_uuid_and_index(nri, sim_node):
    uuid = sim_node["gpus"][2]["uuid"]
    result = run_pod(nri, "default", {ANNOTATION: f"nvidia.com/gpu={uuid},nvidia.com/gpu=3"})
    assert result.rc == 0, result.describe() + nri.log_tail()
    assert nodes(result) == expected_nodes(sim_node, [2, 3]), result.stdout


def test_an_annotation_for_another_container_or_none_gives_nothing(nri):
    for given in ({}, {"nvidia.cdi.k8s.io/container.sidecar": "nvidia.com/gpu=0"}):
        result = run_pod(nri, "default", given)
        assert result.rc == 0 and nodes(result) == set(), result.describe()


def test_a_pod_scoped_annotation_applies_to_its_containers(nri, sim_node):
    result = run_pod(nri, "default", {"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1"})
    assert nodes(result) == expected_nodes(sim_node, [1]), result.describe()


@pytest.mark.parametrize("namespace", ["default", "tenant-a"])
def test_management_devices_outside_the_allowed_namespaces_give_nothing(nri, namespace):
    result = run_pod(nri, namespace, {ANNOTATION: "management.nvidia.com/gpu=all"})
    assert result.rc == 0 and nodes(result) == set(), result.describe()
    assert f"{namespace}/" in nri.installer.log() and "outside the allowed namespaces" in nri.installer.log()
    # the whole annotation is refused, not just its management part
    result = run_pod(nri, namespace, {ANNOTATION: "nvidia.com/gpu=0,management.nvidia.com/gpu=all"})
    assert result.rc == 0 and nodes(result) == set(), result.describe()
    # nor does another spelling of the kind get through
    for value in ("Management.NVIDIA.com/gpu=all", " management.nvidia.com/gpu=all",
                  "nvidia.com/gpu=0,,management.nvidia.com/gpu=all"):
        result = run_pod(nri, namespace, {"nvidia.cdi.k8s.io/pod": value})
        assert result.rc == 0 and nodes(result) == set(), result.describe()


@pytest.mark.parametrize("namespace", [OPERATOR_NS, MONITORING_NS])
def test_management_devices_in_the_allowed_namespaces(nri, sim_node, namespace):
    result = run_pod(nri, namespace, {ANNOTATION: "management.nvidia.com/gpu=all"})
    assert result.rc == 0, result.describe() + nri.log_tail()
    every_gpu = expected_nodes(sim_node, range(len(sim_node["gpus"])))
    assert every_gpu <= nodes(result), result.stdout
    assert all(path.startswith("/dev/nvidia-caps/") for path in nodes(result) - every_gpu), result.stdout


def test_an_unknown_device_fails_the_container(nri):
    with pytest.raises(CriError, match="nvidia.com/gpu=99"):
        run_pod(nri, "default", {ANNOTATION: "nvidia.com/gpu=99"})


def test_the_plugin_registers_again_after_containerd_restarts(nri, sim_node):
    before = nri.installer.log().count("NRI: registered as")
    nri.restart()
    wait_for(lambda: nri.installer.log().count("NRI: registered as") > before, "the plugin registered again",
             detail=lambda: nri.installer.log() + nri.log_tail())
    assert nri.installer.proc.poll() is None
    result = run_pod(nri, "default", {ANNOTATION: "nvidia.com/gpu=1"})
    assert nodes(result) == expected_nodes(sim_node, [1]), result.describe() + nri.log_tail()
