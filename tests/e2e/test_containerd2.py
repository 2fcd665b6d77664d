"""containerd 2.x, for real: the node root's containerd 2.1 (runc 1.3) loads what nvct writes.

``nvct runtime configure`` runs in the node root (its python3, the checkout's
nvct) on config versions 2 and 3, which containerd 2.1 loads: ``containerd
config dump`` shows the ``nvidia`` handler from nvct's drop-in, with the runc
handler's options copied; a CRI pod through that handler gets exactly its GPU
of the simulated node (legacy mode under runc, jit-cdi under crun); ``ctr run
--device nvidia.com/gpu=N`` gets it through CDI from the spec ``nvct cdi
generate`` wrote to ``/var/run/cdi``. Version 4 (containerd 2.3) is checked
against its documented layout: containerd 2.1 refuses to load it. The toolkit
installer, run in the root, configures containerd 2.1 as well.
"""

from __future__ import annotations

import os

import pytest
import tomlkit

from tests.e2e.conftest import expected_nodes, node_config
from tests.engines import toml_loads
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, K8S_NAMESPACE
from tests.support.noderoot import CRI_IMAGES, CRI_RUNTIME, SCRIPTS, NodeContainerd, NodeRoot, entered_node_root

pytestmark = pytest.mark.containers

SHIM = os.path.join(SCRIPTS, "nvidia-container-runtime")
PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"
#: A runc option the nvidia handler must carry over, and a CRI setting the drop-in must not lose.
RUNC_OPTIONS = {"BinaryName": "/usr/sbin/runc", "NoNewKeyring": True}
LOG_LINE_SIZE = 12345


@pytest.fixture(scope="module")
def node():
    with entered_node_root() as n:
        yield n


def nvct(node: NodeRoot, *args: str, config: str | None = None) -> str:
    env = {"NVCT_STATE_DIR": os.environ["NVCT_STATE_DIR"]}
    if config:
        env["NVIDIA_CTK_CONFIG_FILE_PATH"] = config
    result = node.nvct(*args, env=env)
    assert result.ok, result.describe()
    return result.stdout


def configure(node: NodeRoot, config: str, *extra: str) -> None:
    nvct(node, "runtime", "configure", "--runtime", "containerd", "--config", config,
         "--nvidia-runtime-path", SHIM, *extra)


def dump(node: NodeRoot, config: str) -> dict:
    result = node.run(["containerd", "--config", config, "config", "dump"], timeout=60)
    assert result.ok, result.describe()
    return toml_loads(result.stdout)


class NvctContainerd(NodeContainerd):
    """The root's containerd, its config edited by nvct (in the root) before it starts."""

    def config(self):
        config = super().config()
        cri = config["plugins"]["io.containerd.grpc.v1.cri" if self.config_version == 2 else CRI_RUNTIME]
        cri["max_container_log_line_size"] = LOG_LINE_SIZE
        cri["containerd"]["runtimes"]["runc"]["options"] = dict(RUNC_OPTIONS)
        with open(self.config_file, "w") as f:
            f.write(tomlkit.dumps(config))
        configure(self.node, self.config_file)
        with open(self.config_file) as f:
            return tomlkit.parse(f.read())  # start() writes it back byte for byte


#: (config version, the shim's mode, its low-level runtime in the root)
SETUPS = [(2, "legacy", "/usr/sbin/runc"), (3, "legacy", "/usr/sbin/runc"), (3, "jit-cdi", "/usr/bin/crun")]


@pytest.fixture(scope="module", params=SETUPS, ids=[f"v{v}-{m}-{os.path.basename(r)}" for v, m, r in SETUPS])
def containerd2(request, node, sim_node, busybox_image_tar, pause_image_tar, tmp_path_factory):
    version, mode, runtime = request.param
    tmp = tmp_path_factory.mktemp(f"containerd2-v{version}-{mode}")
    config = node_config(tmp, sim_node, mode=mode, runtime=runtime)
    with NvctContainerd(node, config_version=version,
                        extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}) as daemon:
        for namespace in ("default", K8S_NAMESPACE):
            daemon.import_image(busybox_image_tar, namespace)
        daemon.import_image(pause_image_tar, K8S_NAMESPACE)
        yield daemon


def test_containerd_2_loads_the_nvidia_handler_from_nvcts_drop_in(containerd2, node):
    version = containerd2.config_version
    main = toml_loads(open(containerd2.config_file).read())
    drop_in = os.path.join(containerd2.state_dir, "conf.d", "99-nvidia.toml")
    assert main["imports"] == [os.path.join(containerd2.state_dir, "conf.d", "*.toml")]
    written = toml_loads(open(drop_in).read())
    if version == 3:  # containerd 2.x merges imports key by key: only nvct's keys
        assert written == {"version": 3, "plugins": {CRI_RUNTIME: {"containerd": {"runtimes": {"nvidia": {
            "runtime_type": "io.containerd.runc.v2", "options": {**RUNC_OPTIONS, "BinaryName": SHIM}}}}}}}
    plugins = containerd2.ctr(["plugins", "ls"], timeout=30)
    assert plugins.ok, plugins.describe()
    assert any(line.split()[:2] == ["io.containerd.cri.v1", "runtime"] and line.split()[-1] == "ok"
               for line in plugins.stdout.splitlines()), plugins.stdout

    effective = dump(node, containerd2.config_file)
    assert effective["version"] == 3  # containerd 2.x migrates a version 2 config
    cri = effective["plugins"][CRI_RUNTIME]
    handlers = cri["containerd"]["runtimes"]
    assert handlers["nvidia"]["options"]["BinaryName"] == SHIM
    assert handlers["nvidia"]["options"]["NoNewKeyring"] is True  # copied from runc, as the reference does
    assert handlers["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert handlers["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"  # not lost to the drop-in
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert cri["max_container_log_line_size"] == LOG_LINE_SIZE
    assert cri["enable_cdi"] is True  # containerd 2.x's default: nothing to write
    assert effective["plugins"][CRI_IMAGES]["pinned_images"]["sandbox"] == containerd2.sandbox_image


@pytest.mark.parametrize("gpu", [0, 1])
def test_a_cri_pod_through_the_nvidia_handler_gets_its_gpu(containerd2, sim_node, gpu):
    result = containerd2.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], runtime_handler="nvidia",
                                 env={"NVIDIA_VISIBLE_DEVICES": str(gpu)})
    assert result.rc == 0, result.describe() + containerd2.log_tail()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == \
        expected_nodes(sim_node, [gpu])
    assert "ok libcuda.so.1" in result.stdout
    assert f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][gpu]['uuid']})" in result.stdout


def test_a_cri_pod_through_runc_gets_nothing(containerd2):
    result = containerd2.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", "ls /dev | grep -c nvidia; true"],
                                 env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert result.rc == 0 and result.stdout.strip() == "0", result.describe()


def test_ctr_run_device_names_a_cdi_device_of_nvcts_spec(containerd2, node, sim_node):
    nvct(node, "cdi", "generate", "--hook-path", os.path.join(SCRIPTS, "nvct"),
         "--output", "/var/run/cdi/nvidia.yaml", config=sim_node["config"])  # the root's private /run
    result = containerd2.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE],
                                 extra_args=["--device", "nvidia.com/gpu=1"])
    assert result.rc == 0, result.describe() + containerd2.log_tail()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == \
        expected_nodes(sim_node, [1])
    assert "ok libcuda.so.1" in result.stdout


def test_version_4_is_written_in_its_documented_layout(node, tmp_path):
    """containerd 2.3's version 4 keeps version 3's plugin ids: the same edit, its own version."""
    outputs = {}
    for version in (3, 4):
        config = tmp_path / f"v{version}" / "config.toml"
        config.parent.mkdir()
        config.write_text(f"version = {version}\n[plugins.'{CRI_RUNTIME}'.containerd.runtimes.runc.options]\n"
                          f"SystemdCgroup = true\n")
        configure(node, str(config), "--set-as-default", "--cdi.enabled")
        drop_in = config.parent / "conf.d" / "99-nvidia.toml"
        outputs[version] = toml_loads(drop_in.read_text())
        assert toml_loads(config.read_text())["imports"] == [f"{config.parent}/conf.d/*.toml"]
    assert outputs[4] == {**outputs[3], "version": 4}
    assert outputs[4]["plugins"][CRI_RUNTIME] == {"enable_cdi": True, "containerd": {
        "default_runtime_name": "nvidia", "runtimes": {"nvidia": {
            "runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True, "BinaryName": SHIM}}}}}
    refused = node.run(["containerd", "--config", str(tmp_path / "v4" / "config.toml"), "config", "dump"])
    assert not refused.ok and "version equal to or less than `3`, got `4`" in refused.stderr, refused.describe()


@pytest.mark.parametrize("version", [2, 3])
def test_unconfigure_leaves_containerd_2_as_before(node, tmp_path, version):
    plugin = "io.containerd.grpc.v1.cri" if version == 2 else CRI_RUNTIME
    config = tmp_path / "config.toml"
    original = (f"version = {version}\n# the operator's\n[plugins.'{plugin}'.containerd.runtimes.runc.options]\n"
                f"SystemdCgroup = true\n")
    config.write_text(original)
    before = dump(node, str(config))
    configure(node, str(config), "--set-as-default", "--cdi.enabled")
    configured = dump(node, str(config))["plugins"][CRI_RUNTIME]
    assert configured["containerd"]["default_runtime_name"] == "nvidia"
    assert configured["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    nvct(node, "runtime", "unconfigure", "--runtime", "containerd", "--config", str(config))
    assert config.read_text() == original
    assert sorted(os.listdir(tmp_path)) == ["config.toml"]
    assert dump(node, str(config)) == before


def test_a_new_config_is_written_in_the_version_containerd_2_reports(node, tmp_path):
    config = tmp_path / "config.toml"  # none yet: containerd config dump gives its defaults, version 3
    configure(node, str(config), "--config-source", "command")
    assert config.read_text() == f'version = 3\nimports = ["{tmp_path}/conf.d/*.toml"]\n'
    handlers = dump(node, str(config))["plugins"][CRI_RUNTIME]["containerd"]["runtimes"]
    assert handlers["nvidia"]["options"]["BinaryName"] == SHIM


class InstalledContainerd(NodeContainerd):
    """The root's containerd (version 3 config) after the toolkit installer ran in the root."""

    def __init__(self, node: NodeRoot, install: list, **kwargs):
        super().__init__(node, config_version=3, **kwargs)
        self.install = install

    def config(self):
        with open(self.config_file, "w") as f:
            f.write(tomlkit.dumps(super().config()))
        self.installed = self.node.nvct(*self.install, "--config", self.config_file, "--socket", self.socket,
                                        env={"NVCT_STATE_DIR": os.environ["NVCT_STATE_DIR"]}, timeout=300)
        assert self.installed.ok, self.installed.describe()
        with open(self.config_file) as f:
            return tomlkit.parse(f.read())


def test_the_installer_configures_containerd_2_and_its_pods_get_their_gpu(node, sim_node, busybox_image_tar,
                                                                           pause_image_tar, tmp_path):
    from tests.toolkit.installer import node_flags

    toolkit = tmp_path / "install" / "toolkit"
    install = ["toolkit", "install", "--no-daemon", "--toolkit-install-dir", str(tmp_path / "install"),
               "--pid-file", str(tmp_path / "run" / "toolkit.pid"), "--host-root", "/", "--runtime", "containerd",
               "--restart-mode", "none", *node_flags(sim_node)]
    with InstalledContainerd(node, install) as daemon:
        drop_in = toml_loads(open(os.path.join(daemon.state_dir, "conf.d", "99-nvidia.toml")).read())
        assert drop_in["version"] == 3
        assert drop_in["plugins"][CRI_RUNTIME]["containerd"]["default_runtime_name"] == "nvidia"
        handlers = dump(node, daemon.config_file)["plugins"][CRI_RUNTIME]["containerd"]["runtimes"]
        assert handlers["nvidia"]["options"]["BinaryName"] == f"{toolkit}/nvidia-container-runtime"
        assert handlers["nvidia-cdi"]["options"]["BinaryName"] == f"{toolkit}/nvidia-container-runtime.cdi"
        assert handlers["runc"]["options"]["BinaryName"] == "/usr/sbin/runc"
        for tar in (busybox_image_tar, pause_image_tar):
            daemon.import_image(tar, K8S_NAMESPACE)
        result = daemon.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], runtime_handler="nvidia",
                                env={"NVIDIA_VISIBLE_DEVICES": "0"})
        assert result.rc == 0, result.describe() + daemon.log_tail() + daemon.installed.stdout
        assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == \
            expected_nodes(sim_node, [0])
        assert "ok libcuda.so.1" in result.stdout


def test_a_version_2_config_kept_through_an_upgrade_to_containerd_2(node, tmp_path):
    """An upgraded node: the main file still says version 2, containerd 2.1's dump says 3 (the installer's source)."""
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nmax_container_log_line_size = 4321\n'
                      '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                      'SystemdCgroup = true\nBinaryName = "/usr/sbin/runc"\n')
    configure(node, str(config), "--config-source", "command", "--set-as-default")
    drop_in = toml_loads((tmp_path / "conf.d" / "99-nvidia.toml").read_text())
    assert drop_in["version"] == 2
    assert list(drop_in["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]) == ["nvidia"]
    cri = dump(node, str(config))["plugins"][CRI_RUNTIME]
    assert cri["max_container_log_line_size"] == 4321  # containerd 2.x merges the drop-in key by key
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    handlers = cri["containerd"]["runtimes"]
    assert handlers["runc"]["options"]["SystemdCgroup"] is True
    assert handlers["nvidia"]["options"]["SystemdCgroup"] is True
    assert handlers["nvidia"]["options"]["BinaryName"] == SHIM
