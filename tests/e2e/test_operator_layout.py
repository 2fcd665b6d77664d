"""A node laid out as the GPU Operator lays it out: the driver root holds its own ``dev/``.

The Operator's driver container is mounted at ``/run/nvidia/driver``, with the
device nodes in ``/run/nvidia/driver/dev`` and none in the host's ``/dev``; its
config sets only ``nvidia-container-cli.root``. Here a simulated node is built
at ``<host>/run/nvidia/driver`` and its config has no ``[nvct] dev-root`` (the
proc root stays set: this machine's kernel has no NVIDIA module). Every command must then find the
nodes under the driver root, as the reference does, and agree on them; real
containers get their GPUs and an IMEX channel.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.conftest import NVCT, VENV_BIN, expected_nodes, node_config
from tests.support.gpu_runs import need_runtime, run_gpu

IMEX0 = "/dev/nvidia-caps-imex-channels/channel0"


@pytest.fixture(scope="module")
def operator_node(tmp_path_factory):
    """A node at ``<host>/run/nvidia/driver``, under a config naming only the driver root (and the proc root)."""
    from tests.support.fixtures import need_root

    need_root("builds a simulated node with mknod")
    from nvct.simulate import build_node

    host = tmp_path_factory.mktemp("operator-host")
    node = build_node(host / "run/nvidia/driver")
    root = node["roots"]["driver_root"]
    assert not (host / "dev").exists()  # the "host" has no /dev/nvidia*: only the driver root has nodes
    path = host / "config.toml"
    path.write_text(f'[nvidia-container-cli]\nroot = "{root}"\n\n'
                    f'[nvct]\nproc-root = "{node["roots"]["proc_root"]}"\n')
    return {**node, "config": str(path)}


def _run(argv, config, *extra_env) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = config
    env.update(extra_env)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _all_nodes(node) -> set[str]:
    """Every node a container may get: control nodes, all GPUs, all MIG devices' caps."""
    return expected_nodes(node, range(len(node["gpus"])), [(0, 0), (0, 1)])


def _host(node, paths) -> set[str]:
    root = node["roots"]["driver_root"]
    return {root + p for p in paths}


def test_list_and_info_find_the_nodes_under_the_driver_root(operator_node):
    config, root = operator_node["config"], operator_node["roots"]["driver_root"]
    listed = json.loads(_run([NVCT, "list", "--json"], config))
    assert listed["roots"]["dev_root"] == root
    paths = {n["path"] for n in listed["device_nodes"]}
    assert paths >= _all_nodes(operator_node)
    host_list = _run([os.path.join(VENV_BIN, "nvidia-container-cli"), "list", "--device=all"], config).split()
    # The reference's list names MIG devices by their /proc access files, not their cap nodes.
    gpus = expected_nodes(operator_node, range(len(operator_node["gpus"])))
    assert {p for p in host_list if "/dev/" in p} == _host(operator_node, gpus)
    info = _run([NVCT, "info"], config)
    assert info.count("Device Index:") == len(operator_node["gpus"])


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_explain_takes_the_nodes_from_the_driver_root(operator_node, tmp_path, mode):
    config = node_config(tmp_path, operator_node, mode=mode)
    out = json.loads(_run([NVCT, "explain", "--json", "-e", "NVIDIA_VISIBLE_DEVICES=1,3",
                           "-e", "NVIDIA_IMEX_CHANNELS=0"], config))
    edits = out["inside"] if mode == "legacy" else out["edits"]  # legacy: what the hook does at start
    nodes = {n["path"]: n["hostPath"] for n in edits["deviceNodes"]}
    assert set(nodes) == expected_nodes(operator_node, [1, 3]) | {IMEX0}
    assert all(host == operator_node["roots"]["driver_root"] + path for path, host in nodes.items())


@pytest.mark.parametrize("program", ["nvct", "nvidia-ctk"])
def test_cdi_generate_takes_the_nodes_from_the_driver_root(operator_node, tmp_path, program):
    spec_path = tmp_path / "nvidia.json"
    _run([os.path.join(VENV_BIN, program), "cdi", "generate", "--format", "json", "--output", str(spec_path)],
         operator_node["config"])
    spec = json.loads(spec_path.read_text())
    edits = [d["containerEdits"] for d in spec["devices"]] + [spec["containerEdits"]]
    nodes = {n["path"]: n.get("hostPath", n["path"]) for e in edits for n in e.get("deviceNodes", [])}
    assert set(nodes) >= _all_nodes(operator_node)
    assert all(host == operator_node["roots"]["driver_root"] + path for path, host in nodes.items())


def test_doctor_says_which_dev_root_and_why(operator_node):
    root = operator_node["roots"]["driver_root"]
    findings = {f["id"]: f for f in json.loads(_run([NVCT, "doctor", "--json"], operator_node["config"]))["findings"]}
    roots = findings["config.roots"]
    assert roots["status"] == "ok"
    assert f"dev root {root} (the driver root, as nvct.dev-root is not set)" in roots["seen"]
    nodes = findings["devices.nodes"]
    assert nodes["status"] == "ok" and f"device nodes under {root} with the right majors" in nodes["seen"]
    links = findings["devices.char-links"]  # the host's /dev/char (systemd's), with links into the driver root
    assert links["status"] == "warn" and links["seen"].startswith("no /dev/char/M:m link for ")
    assert links["fix"] == "nvct system create-dev-char-symlinks --create-all"
    node_checks = ("config.", "driver.", "devices.", "libraries.")  # not the engines: those are this host's
    assert [f for f in findings.values() if f["id"].startswith(node_checks) and f["status"] == "fail"] == []


@pytest.mark.containers
@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])  # cdi mode: channels are CDI devices, not env
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_container_gets_its_gpus_and_an_imex_channel(operator_node, tmp_path, rootfs, runtime, mode):
    need_runtime(runtime)
    result = run_gpu(tmp_path, operator_node, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=1,3", "NVIDIA_IMEX_CHANNELS=0"],
                     command="find /dev -type c -name 'nvidia*' -o -type c -name 'channel*' | sort; nvidia-smi -L")
    assert result.ok, result.describe()
    lines = result.stdout.splitlines()
    assert {line for line in lines if line.startswith("/dev/")} == expected_nodes(operator_node, [1, 3]) | {IMEX0}
    uuids = [operator_node["gpus"][i]["uuid"] for i in (1, 3)]
    assert [line for line in lines if line.startswith("GPU ")] == [
        f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {u})" for n, u in enumerate(uuids)]


def test_nvidia_container_cli_root_flag_moves_the_dev_root_too(operator_node, tmp_path):
    """``nvidia-container-cli --root`` (how enroot and apptainer name a driver container's root)."""
    root = operator_node["roots"]["driver_root"]
    config = tmp_path / "config.toml"
    config.write_text(f'[nvct]\nproc-root = "{operator_node["roots"]["proc_root"]}"\n')
    out = _run([os.path.join(VENV_BIN, "nvidia-container-cli"), f"--root={root}", "list", "--device=1"], str(config))
    assert {p for p in out.split() if "/dev/" in p} == _host(operator_node, expected_nodes(operator_node, [1]))


@pytest.mark.containers
def test_a_cdi_mode_container_gets_its_gpus_from_the_generated_spec(operator_node, tmp_path, rootfs):
    """cdi mode: the spec nvct cdi generate wrote on this node (run_gpu writes it) gives the GPUs."""
    need_runtime("runc")
    result = run_gpu(tmp_path, operator_node, rootfs, mode="cdi", env=["NVIDIA_VISIBLE_DEVICES=1,3"],
                     command="find /dev -type c -name 'nvidia*' | sort")
    assert result.ok, result.describe()
    assert set(result.stdout.split()) == expected_nodes(operator_node, [1, 3])
