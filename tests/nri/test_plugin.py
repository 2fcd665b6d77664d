"""The annotation contract, the management namespaces, registration and reconnecting, and the
installer's NRI options."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from nvct.base.errors import ConfigError
from nvct.nri import messages as m, ttrpc, wire
from nvct.nri.plugin import NriError, Plugin, Policy
from nvct.toolkit.options import Options

POLICY = Policy(["gpu-operator", "dcgm"])


@pytest.mark.parametrize("annotations, container, expected", [
    ({"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0"}, "app", ["nvidia.com/gpu=0"]),
    ({"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0"}, "other", []),
    ({"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0", "nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1"},
     "app", ["nvidia.com/gpu=0"]),  # the container's own annotation wins
    ({"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=1", "nvidia.cdi.k8s.io": "nvidia.com/gpu=2"}, "x", ["nvidia.com/gpu=1"]),
    ({"nvidia.cdi.k8s.io": "nvidia.com/gpu=2"}, "x", ["nvidia.com/gpu=2"]),
    ({"nvidia.cdi.k8s.io/container.app": " nvidia.com/gpu=0, nvidia.com/gpu=GPU-1 ,"}, "app",
     ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-1"]),
    ({"nvidia.cdi.k8s.io/container.app": ""}, "app", []),
    ({"cdi.k8s.io/container.app": "nvidia.com/gpu=0"}, "app", []),  # another domain: not ours
])
def test_the_annotation_contract(annotations, container, expected):
    assert POLICY.devices(m.Pod(namespace="default", annotations=annotations), container)[0] == expected


@pytest.mark.parametrize("namespace, allowed", [("gpu-operator", True), ("dcgm", True), ("default", False),
                                                ("gpu-operator-x", False), ("", False)])
def test_management_devices_only_in_the_allowed_namespaces(namespace, allowed):
    value = "nvidia.com/gpu=0,management.nvidia.com/gpu=all"
    devices, why = POLICY.devices(m.Pod(namespace=namespace, annotations={"nvidia.cdi.k8s.io/pod": value}), "c")
    assert devices == (value.split(",") if allowed else [])
    assert allowed or "outside the allowed namespaces (gpu-operator, dcgm)" in why
    upper = m.Pod(namespace=namespace, annotations={"nvidia.cdi.k8s.io": "MANAGEMENT.nvidia.com/GPU=all"})
    assert bool(POLICY.devices(upper, "c")[0]) == allowed  # the kind in any case


def test_create_container_replies_with_the_cdi_devices_only():
    request = wire.message(1, wire.string(4, "default") + wire.string_map(
        6, {"nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=0,nvidia.com/gpu=1"})) + wire.message(
        2, wire.string(3, "app"))
    reply = Plugin("/x", "10", POLICY, lambda line: None).handle("CreateContainer", request)
    adjust = wire.parse(reply)
    assert list(adjust) == [1]
    devices = wire.get_msg(adjust, 1)
    assert list(devices) == [8]
    assert [wire.get_str(wire.parse(d), 1) for d in devices[8]] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    empty = wire.message(1, wire.string(4, "default")) + wire.message(2, wire.string(3, "app"))
    assert Plugin("/x", "10", POLICY, lambda line: None).handle("CreateContainer", empty) == b""


class FakeRuntime:
    """An NRI socket that accepts RegisterPlugin, then drops each connection after ``answer`` (a runtime restart)."""

    def __init__(self, path: str, refuse: str = "") -> None:
        self.path = path
        self.refuse = refuse
        self.registrations: list[tuple[str, str]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen()
        self.drop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                demux = ttrpc.Demux()
                while True:
                    data = conn.recv(4096)
                    if not data:
                        break
                    for _, msg in demux.feed(data):
                        request = ttrpc.Request.decode(msg.payload)
                        fields = wire.parse(request.payload)
                        self.registrations.append((wire.get_str(fields, 1), wire.get_str(fields, 2)))
                        answer = ttrpc.Response(ttrpc.INTERNAL if self.refuse else ttrpc.OK, self.refuse)
                        conn.sendall(ttrpc.mux_frame(ttrpc.RUNTIME_CONN,
                                                     ttrpc.message(msg.stream_id, ttrpc.RESPONSE, answer.encode())))
                    if self.drop.wait(0.01):
                        self.drop.clear()
                        break

    def close(self) -> None:
        self.server.close()


def test_the_plugin_registers_with_its_index_and_again_after_the_runtime_drops_it(tmp_path):
    runtime = FakeRuntime(str(tmp_path / "nri.sock"))
    plugin = Plugin(runtime.path, "07", POLICY, lambda line: None, reconnect_s=0.01).start(timeout=5)
    try:
        assert runtime.registrations == [("nvidia-ctk-installer", "07")]
        plugin.registered.clear()
        runtime.drop.set()
        assert plugin.registered.wait(5)
        assert runtime.registrations == [("nvidia-ctk-installer", "07")] * 2
    finally:
        plugin.stop()
        runtime.close()
    assert not plugin._thread.is_alive()


def test_no_socket_or_a_refusal_is_one_line(tmp_path):
    with pytest.raises(NriError, match=r"nri.sock: not found \(is NRI enabled"):
        Plugin(str(tmp_path / "nri.sock"), "10", POLICY, print).start()
    runtime = FakeRuntime(str(tmp_path / "nri.sock"), refuse="plugin 10-nvidia-ctk-installer already registered")
    try:
        with pytest.raises(NriError, match="did not accept"):
            Plugin(runtime.path, "10", POLICY, lambda line: None, reconnect_s=0.01).start(timeout=0.5)
    finally:
        runtime.close()


def resolved(**kwargs) -> Options:
    return Options(install_dir="/opt/nvct", pid_file="/run/nvct/toolkit.pid", host_root="/", runtime="containerd",
                   **kwargs).resolved()


def test_nri_mode_writes_no_engine_config_and_needs_a_namespace():
    assert resolved(enable_nri_plugin=True, nri_namespace="gpu-operator").no_runtime_config
    assert not resolved().no_runtime_config
    with pytest.raises(ConfigError, match="NRI namespace must be set"):
        resolved(enable_nri_plugin=True)
    with pytest.raises(ConfigError, match="--nri-plugin-index: 100 is not in 0..99"):
        resolved(enable_nri_plugin=True, nri_namespace="x", nri_plugin_index=100)


def test_config_source_file_path_is_accepted():
    assert resolved(config_sources=["file=/runtime/config-dir/config.toml"]).config_source == \
        "file=/runtime/config-dir/config.toml"
    with pytest.raises(ConfigError, match="not an absolute path"):
        resolved(config_sources=["file=config.toml"])
    with pytest.raises(ConfigError, match="not supported"):
        resolved(config_sources=["command=/usr/bin/containerd"])


def test_config_source_file_path_is_what_the_runtimes_are_read_from(tmp_path):
    from nvct import engines as runtimes

    config, source = tmp_path / "config.toml", tmp_path / "source.toml"
    config.write_text("version = 3\n")
    source.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
                      'BinaryName = "/opt/runc/bin/runc"\n')
    assert "/opt/runc/bin/runc" in runtimes.low_level_runtime_paths(
        "containerd", str(config), config_source=f"file={source}")
    assert "/opt/runc/bin/runc" not in runtimes.low_level_runtime_paths("containerd", str(config))
    # absent: the config itself, as the file source
    assert runtimes.low_level_runtime_paths("containerd", str(config), config_source=f"file={tmp_path}/none") == \
        runtimes.low_level_runtime_paths("containerd", str(config))


def test_the_cli_reads_the_operators_variables(monkeypatch):
    from click.testing import CliRunner

    from nvct.cli.toolkit import install_command

    seen = {}
    monkeypatch.setattr("nvct.toolkit.run", lambda opts: seen.setdefault("opts", opts) and 0)
    env = {"ENABLE_NRI_PLUGIN": "true", "NRI_SOCKET": "/run/nri/x.sock", "NRI_PLUGIN_INDEX": "5",
           "NRI_NAMESPACE": "gpu-operator", "NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES": "dcgm,monitoring",
           "RUNTIME_CONFIG_SOURCE": "file=/runtime/config-dir/config.toml"}
    result = CliRunner().invoke(install_command, [], env=env)
    opts = seen["opts"]
    assert (opts.enable_nri_plugin, opts.nri_socket, opts.nri_plugin_index, opts.nri_namespace,
            opts.nri_management_namespaces, opts.config_sources) == (
        True, "/run/nri/x.sock", 5, "gpu-operator", ["dcgm", "monitoring"], ["file=/runtime/config-dir/config.toml"]
    ), result.output


def test_nri_mode_keeps_the_low_level_runtimes_of_the_last_install(tmp_path):
    """No engine config is read in NRI mode: the runtimes come from the installed config.toml (the reference's rule)."""
    from nvct.toolkit.engine import EngineSetup
    from nvct.toolkit.layout import Layout

    layout = Layout.for_install_dir(str(tmp_path))
    opts = Options(install_dir=str(tmp_path), pid_file="/run/nvct/toolkit.pid", host_root="/", runtime="containerd",
                   enable_nri_plugin=True, nri_namespace="gpu-operator").resolved()
    assert EngineSetup(opts, layout, print).low_level_runtimes() == ["runc", "crun"]  # a first install
    os.makedirs(layout.config_dir)
    with open(layout.config(), "w") as f:
        f.write('[nvidia-container-runtime]\nruntimes = ["/opt/old/bin/runc", "runc"]\n')
    assert EngineSetup(opts, layout, print).low_level_runtimes() == ["/opt/old/bin/runc", "runc", "crun"]
    with open(layout.config(), "w") as f:
        f.write("[nvidia-container-runtime\n")  # unreadable: the defaults
    assert EngineSetup(opts, layout, print).low_level_runtimes() == ["runc", "crun"]
