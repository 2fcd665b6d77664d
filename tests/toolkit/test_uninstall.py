"""Package removal (nvct.toolkit.uninstall): undo what nvct configured, remove generated specs, name what is left."""

from __future__ import annotations

import json
import os

import pytest

from nvct import engines as runtimes
from nvct.toolkit import uninstall

REFERENCE_DAEMON_JSON = {"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}


@pytest.fixture
def node(tmp_path, monkeypatch):
    monkeypatch.setenv("NVCT_STATE_DIR", str(tmp_path / "state"))
    for name in ("etc/docker", "etc/cdi", "run/cdi"):
        (tmp_path / name).mkdir(parents=True)
    monkeypatch.setattr(uninstall, "ENGINE_FILES", (f"{tmp_path}/etc/docker/*.json",))
    monkeypatch.setattr(uninstall, "SPEC_DIRS", (f"{tmp_path}/etc/cdi",))
    monkeypatch.setattr(uninstall, "GENERATED_SPECS", f"{tmp_path}/run/cdi")
    monkeypatch.setattr(uninstall, "RUNTIMES", (f"{tmp_path}/usr/bin/nvidia-container-runtime",))
    monkeypatch.setattr(uninstall, "STANDIN_DIR", f"{tmp_path}/run/nvct-standins")
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


POSTRM = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "packaging", "debian", "nvct.postrm")


def test_removal_leaves_stand_ins_for_the_runtime_programs_running_containers_name(tmp_path, monkeypatch, capsys):
    from nvct.toolkit import standin

    runtime, cdi = "/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi"
    monkeypatch.setattr(uninstall, "STANDIN_DIR", str(tmp_path / "standins"))
    monkeypatch.setattr(uninstall, "CONFIG", str(tmp_path / "config.toml"))
    (tmp_path / "config.toml").write_text('[nvidia-container-runtime]\nruntimes = ["crun", "runc"]\n')
    monkeypatch.setattr(standin, "referencing", lambda paths: {runtime: [41, 42]} if runtime in paths else {})
    assert uninstall.leave_standins() == [
        f"{runtime}: a stand-in takes its place for the containers still running on it (shim pids 41, 42), so "
        f"they can be stopped and deleted; it goes with the last of them"]
    [left] = os.listdir(tmp_path / "standins")
    text = (tmp_path / "standins" / left).read_text()
    assert left == "nvidia-container-runtime" and f"self={runtime}\n" in text and "for runtime in crun runc;" in text
    assert cdi not in text


def _postrm_standins(tmp_path) -> str:
    """postrm's ``standins`` function, on tmp_path's standins/ and bin/ instead of /run and /usr/bin."""
    with open(POSTRM) as f:
        text = f.read()
    start, end = text.index("standins() {"), text.index("\n}\n", text.index("standins() {")) + 3
    return (text[start:end].replace("/run/nvct-standins", f"{tmp_path}/standins")
            .replace("/usr/bin/", f"{tmp_path}/bin/"))


def test_postrm_puts_the_stand_ins_in_place_and_each_goes_with_its_last_container(tmp_path):
    import subprocess
    import sys

    from nvct.toolkit import standin

    (tmp_path / "standins").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "keep").write_text("")  # /usr/bin is never empty
    names = ("nvidia-container-runtime", "nvidia-container-runtime.cdi")
    for name in names:
        path = tmp_path / "standins" / name
        path.write_text(standin.script(f"{tmp_path}/bin/{name}", ["runc"]))
        path.chmod(0o755)
    # a process still naming the first (as conmon names its runtime on its command line)
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", f"{tmp_path}/bin/{names[0]}"],
                              stdin=subprocess.PIPE)
    try:
        subprocess.run(["sh", "-ec", _postrm_standins(tmp_path) + "standins\n"], check=True)
        assert sorted(os.listdir(tmp_path / "bin")) == ["keep", names[0]]  # the other had no container left
        assert not (tmp_path / "standins").exists()
    finally:
        holder.communicate(b"")
    subprocess.run([f"{tmp_path}/bin/{names[0]}", "--nvct-prune"], check=True)
    assert os.listdir(tmp_path / "bin") == ["keep"]


def test_a_running_installers_configuration_is_left_to_it(node, capsys):
    """The toolkit installer runs its own copy of nvct: the package's removal leaves its changes alone."""
    daemon = node / "etc/docker/daemon.json"
    daemon.write_text('{}\n')
    runtimes.configure("docker", str(daemon), {"nvidia": "/opt/toolkit/nvidia-container-runtime"},
                       owner=runtimes.installer_owner("/opt/toolkit"))
    configured = daemon.read_text()
    assert uninstall.main([]) == 0
    assert daemon.read_text() == configured
    assert "undid" not in capsys.readouterr().out
    runtimes.unconfigure("docker", str(daemon), owner=runtimes.installer_owner("/opt/toolkit"))
    assert daemon.read_text() == '{}\n'


def test_a_configuration_under_a_running_installers_goes_with_it(node, capsys):
    daemon = node / "etc/docker/daemon.json"
    daemon.write_text('{}\n')
    runtimes.configure("docker", str(daemon))
    owner = runtimes.installer_owner("/opt/toolkit")
    runtimes.configure("docker", str(daemon), {"nvidia": "/opt/toolkit/nvidia-container-runtime"},
                       set_default="nvidia", owner=owner)
    configured = daemon.read_text()
    assert uninstall.main([]) == 0
    assert daemon.read_text() == configured
    assert capsys.readouterr().out == (f"nvct: {daemon}: {owner} changed it after nvct runtime configure did; the "
                                       f"earlier changes are undone with its own\n")
    runtimes.unconfigure("docker", str(daemon), owner=owner)
    assert daemon.read_text() == '{}\n'
