"""Package removal (nvct.uninstall): undo what nvct configured, remove generated specs, name what is left."""

from __future__ import annotations

import json

import pytest

from nvct import runtimes, uninstall

REFERENCE_DAEMON_JSON = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setenv("NVCT_STATE_DIR", str(tmp_path / "state"))
    for name in ("etc/docker", "etc/cdi", "run/cdi"):
        (tmp_path / name).mkdir(parents=True)
    monkeypatch.setattr(uninstall, "ENGINE_FILES", (f"{tmp_path}/etc/docker/*.json",))
    monkeypatch.setattr(uninstall, "SPEC_DIRS", (f"{tmp_path}/etc/cdi",))
    monkeypatch.setattr(uninstall, "GENERATED_SPECS", f"{tmp_path}/run/cdi")
    return tmp_path


def _spec(path, program="/usr/bin/nvct"):
    path.write_text(f'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices: []\ncontainerEdits:\n  hooks:\n'
                    f'  - hookName: createContainer\n    path: {program}\n')


def test_removal_undoes_what_nvct_configured_and_removes_generated_specs(node, capsys):
    daemon = node / "etc/docker/daemon.json"
    daemon.write_text('{"log-level": "warn"}\n')
    runtimes.configure("docker", str(daemon), set_default="nvidia")
    _spec(node / "run/cdi/nvidia.yaml", "/usr/bin/nvidia-cdi-hook")
    _spec(node / "run/cdi/other-vendor.yaml", "/opt/vendor/hook")
    assert uninstall.main([]) == 0
    assert daemon.read_text() == '{"log-level": "warn"}\n'
    assert sorted(p.name for p in node.rglob("*") if p.is_file()) == ["daemon.json", "other-vendor.yaml"]
    assert capsys.readouterr().out == (
        f"nvct: undid its configuration of docker in {daemon} (restart dockerd to apply)\n"
        f"nvct: removed {node}/run/cdi/nvidia.yaml (a CDI spec whose hooks run nvct's programs)\n")


def test_what_nvct_did_not_write_is_named_with_what_to_do(node, capsys):
    daemon = node / "etc/docker/daemon.json"
    daemon.write_text(json.dumps(REFERENCE_DAEMON_JSON))
    _spec(node / "etc/cdi/nvidia.yaml")
    assert uninstall.main([]) == 0
    assert daemon.read_text() == json.dumps(REFERENCE_DAEMON_JSON)
    assert capsys.readouterr().out == (
        f"nvct: {daemon} still names nvidia-container-runtime, which is removed with nvct: remove that entry "
        "(or install the NVIDIA Container Toolkit, which provides it), then restart the engine\n"
        f"nvct: {node}/etc/cdi/nvidia.yaml is a CDI spec whose hooks run /usr/bin/nvct, which is removed with "
        "nvct: delete it, or regenerate it with the toolkit that replaces nvct\n")


def test_replaced_by_the_nvidia_toolkit_changes_nothing(node, capsys):
    daemon = node / "etc/docker/daemon.json"
    daemon.write_text('{}\n')
    runtimes.configure("docker", str(daemon))
    configured = daemon.read_text()
    _spec(node / "run/cdi/nvidia.yaml")
    assert uninstall.main(["--in-favour", "nvidia-container-toolkit"]) == 0
    assert daemon.read_text() == configured and (node / "run/cdi/nvidia.yaml").exists()
    assert capsys.readouterr().out == ("nvct: replaced by nvidia-container-toolkit, which provides the same "
                                       "programs: engine configs and CDI specs are left as they are\n")
