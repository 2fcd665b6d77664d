"""Today's CLIs' ``--gpus``, for real, in the node root: which path each takes, and what a container gets.

docker.io 28.5.2 (Debian), containerd 2.1.9's ctr and podman 5.8 run in the
node root (tests/support/noderoot.py) on the simulated node. Measured:
dockerd 28.5.2 has no CDI route for ``--gpus`` (moby#50228 is not in it): with
only ``nvidia-cdi-hook`` on its PATH the flag fails, with nvct's hook it takes
the prestart-hook path. Its CDI path is ``--device nvidia.com/gpu=...`` (a
``cdi`` device request), as podman's; ctr 2.1's ``--gpus`` runs
``nvidia-container-cli``. ``nvct doctor`` in the root says the same.
"""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest

from tests.e2e.conftest import expected_nodes, node_config
from tests.support.fixtures import BUSYBOX_IMAGE, BUSYBOX_IMAGE_QUALIFIED
from tests.support.noderoot import SCRIPTS, NodeContainerd, NodeRoot, entered_node_root

pytestmark = pytest.mark.containers

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"
SPEC = "/var/run/cdi/nvidia.yaml"  # the root's private /run: where nvidia-cdi-refresh writes it


@pytest.fixture(scope="module")
def node():
    with entered_node_root() as n:
        yield n


@pytest.fixture(scope="module")
def spec(node, sim_node):
    """``nvct cdi generate`` of the simulated node, where the engines of the root read specs."""
    result = node.nvct("cdi", "generate", "--hook-path", os.path.join(SCRIPTS, "nvidia-cdi-hook"), "--output", SPEC,
                       env={"NVCT_STATE_DIR": os.environ["NVCT_STATE_DIR"],
                            "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]})
    assert result.ok, result.describe()
    return SPEC


def _bin(tmp, *programs: str, source: str = SCRIPTS) -> str:
    """A directory holding only ``programs`` (nvct's): what the engine finds is what the test chose."""
    tmp.mkdir()
    for program in programs:
        os.symlink(os.path.join(source, program), tmp / program)
    return str(tmp)


def _gets(result, sim_node, gpus) -> None:
    assert result.rc == 0, result.describe()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == expected_nodes(sim_node, gpus)
    assert "ok libcuda.so.1" in result.stdout
    smi = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert smi == [f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {sim_node['gpus'][g]['uuid']})"
                   for n, g in enumerate(gpus)], result.stdout


def _doctor(node: NodeRoot, *args: str, env=None) -> dict:
    result = node.nvct("doctor", "--json", *args, env={"NVCT_STATE_DIR": os.environ["NVCT_STATE_DIR"], **(env or {})})
    return {f["id"]: f for f in json.loads(result.stdout)["findings"]}


# --- docker 28.5.2 ---
@pytest.fixture(scope="module")
def dockerd(node, sim_node, spec, busybox_image_tar, tmp_path_factory):
    """The root's dockerd with both of nvct's hook programs on its PATH."""
    from tests.support.docker import Dockerd

    tmp = tmp_path_factory.mktemp("cli-gpus-docker")
    config = node_config(tmp, sim_node, mode="legacy")
    path = _bin(tmp / "bin", "nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvct")
    with Dockerd(wrapper=node.prefix, path_prefix=(path,), extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}) as d:
        d.load(busybox_image_tar)
        yield d


def test_docker_28_gpus_all_takes_the_hook_path(dockerd, sim_node):
    result = dockerd.run(["--rm", "--gpus", "all", BUSYBOX_IMAGE, "sh", "-c", PROBE])
    gpus = list(range(len(sim_node["gpus"])))
    assert result.rc == 0, result.describe() + dockerd.log_tail()
    nodes = {line for line in result.stdout.splitlines() if line.startswith("/dev/")}
    all_migs = [(g, m) for g, gpu in enumerate(sim_node["gpus"]) for m in range(len(gpu.get("mig_devices") or []))]
    assert nodes == expected_nodes(sim_node, gpus, all_migs)
    assert len([line for line in result.stdout.splitlines() if line.startswith("GPU ")]) == len(gpus)


@pytest.mark.parametrize("how", ["index", "uuid", "mig", "mig-uuid"])
def test_docker_28_gpus_device_gets_exactly_that_device(dockerd, sim_node, how):
    name, gpus, migs = _name(sim_node, how)
    result = dockerd.run(["--rm", "--gpus", f"device={name}", BUSYBOX_IMAGE, "sh", "-c", PROBE])
    assert result.rc == 0, result.describe() + dockerd.log_tail()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == \
        expected_nodes(sim_node, gpus, migs)
    assert "ok libcuda.so.1" in result.stdout


def test_docker_28_has_no_cdi_route_for_gpus(node, sim_node, busybox_image_tar, tmp_path):
    """Only nvidia-cdi-hook on dockerd's PATH: a dockerd with moby#50228 would ask CDI; 28.5.2 fails."""
    from tests.support.docker import Dockerd

    path = _bin(tmp_path / "bin", "nvidia-cdi-hook")
    with Dockerd(wrapper=node.prefix, path_prefix=(path,)) as d:
        d.load(busybox_image_tar)
        result = d.run(["--rm", "--gpus", "all", BUSYBOX_IMAGE, "true"])
        found = _doctor(node, "--docker-socket", d.socket)["runtime.docker-gpus"]
    assert not result.ok and 'could not select device driver "" with capabilities: [[gpu]]' in result.stderr, \
        result.describe()
    assert found["status"] == "fail" and "has no CDI route for --gpus" in found["seen"], found


@pytest.mark.parametrize("how", ["index", "uuid"])
def test_docker_28_cdi_device_request_gets_exactly_that_gpu(dockerd, sim_node, how):
    """docker 28's CDI path: a ``cdi`` device request (the 20.10 client cannot say --device nvidia.com/gpu=1)."""
    name, gpus, _ = _name(sim_node, how)
    _gets(_api_run(dockerd.socket, BUSYBOX_IMAGE, ["sh", "-c", PROBE],
                   [{"Driver": "cdi", "DeviceIDs": [f"nvidia.com/gpu={name}"]}]), sim_node, gpus)


def test_explain_says_docker_28_hands_the_hook_the_device(node, dockerd):
    result = node.nvct("explain", "--gpus", "device=1", "--docker-socket", dockerd.socket)
    assert result.ok, result.describe()
    assert result.stdout.startswith("docker run --gpus device=1: the hook path ("), result.stdout
    assert "gets NVIDIA_VISIBLE_DEVICES=1;" in result.stdout


def test_doctor_says_docker_28_takes_the_hook_path(node, dockerd):
    found = _doctor(node, "--docker-socket", dockerd.socket)["runtime.docker-gpus"]
    assert found["status"] == "ok", found
    assert "docker run --gpus works, on the hook path" in found["seen"]
    assert "has no CDI route for --gpus (it never looks up nvidia-cdi-hook)" in found["seen"]


# --- ctr (containerd 2.1) ---
def test_ctr_2_1_gpus_runs_nvidia_container_cli(node, sim_node, busybox_image_tar, tmp_path):
    path = _bin(tmp_path / "bin", "nvidia-container-cli", "nvct")
    config = node_config(tmp_path, sim_node, mode="legacy")
    with NodeContainerd(node, path_prefix=[path], extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}) as daemon:
        daemon.import_image(busybox_image_tar)
        result = daemon.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], extra_args=["--gpus", "1"])
        _gets(result, sim_node, [1])
        found = _doctor(node, env={"PATH": f"{path}:/usr/sbin:/usr/bin:/sbin:/bin"})["runtime.ctr-gpus"]
    assert found["status"] == "ok" and "ctr run --gpus takes the hook path" in found["seen"], found


@pytest.mark.parametrize("knows_the_cli", [True, False], ids=["nerdctl-2.2", "nerdctl-2.3"])
def test_doctor_says_which_path_nerdctl_takes(node, spec, tmp_path, knows_the_cli):
    """No nerdctl in Debian: a stand-in program, with or without the hook program's name in it."""
    path = _bin(tmp_path / "bin", "nvidia-container-cli")
    (tmp_path / "bin" / "nerdctl").write_text("#!/bin/sh\n# " + ("nvidia-container-cli" if knows_the_cli else "")
                                              + "\n")
    (tmp_path / "bin" / "nerdctl").chmod(0o755)
    found = _doctor(node, env={"PATH": f"{path}:/usr/sbin:/usr/bin:/sbin:/bin"})["runtime.nerdctl-gpus"]
    assert found["status"] == "ok", found
    if knows_the_cli:
        assert "nerdctl run --gpus takes the hook path" in found["seen"]
    else:
        assert "nerdctl run --gpus all takes the CDI path: nvidia.com/gpu=all resolve in /etc/cdi, /var/run/cdi" \
            in found["seen"]


# --- podman 5 ---
@pytest.fixture(scope="module")
def podman5(node, spec, busybox_image_tar):
    from tests.support.podman import Podman

    class NodePodman(Podman):
        def podman(self, args, *, timeout=120):
            from tests.support.proc import run

            return run([*node.prefix, "/usr/bin/podman", *args], env=self.env, timeout=timeout)

    with NodePodman(runtime="/usr/bin/crun") as podman:
        version = podman.podman(["--version"]).check().stdout
        assert version.split()[-1].startswith("5."), version
        podman.load(busybox_image_tar)
        yield podman


def _name(sim_node, how: str) -> tuple[str, list, list]:
    """A device name of nvct's spec, and the (gpus, migs) it stands for."""
    gpu1 = sim_node["gpus"][1]
    mig = sim_node["gpus"][0]["mig_devices"][1]
    return {"index": ("1", [1], []), "uuid": (gpu1["uuid"], [1], []), "mig": ("0:1", [], [(0, 1)]),
            "mig-uuid": (mig["uuid"], [], [(0, 1)])}[how]


@pytest.mark.parametrize("how", ["index", "uuid", "mig", "mig-uuid"])
def test_podman_5_device_names_a_cdi_device_of_nvcts_spec(podman5, sim_node, how):
    name, gpus, migs = _name(sim_node, how)
    result = podman5.run(["--rm", "--device", f"nvidia.com/gpu={name}", BUSYBOX_IMAGE, "sh", "-c", PROBE])
    assert result.rc == 0, result.describe()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == \
        expected_nodes(sim_node, gpus, migs)
    assert "ok libcuda.so.1" in result.stdout


def _api_run(sock: str, image: str, cmd: list, device_requests: list):
    """create, start, wait, logs, remove through dockerd's API: what a newer docker client sends."""
    from tests.support.proc import Result

    def call(method, path, body=None):
        conn = http.client.HTTPConnection("localhost", timeout=120)
        conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.sock.connect(sock)
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    status, data = call("POST", "/v1.45/containers/create", {
        "Image": image, "Cmd": cmd, "HostConfig": {"NetworkMode": "none", "DeviceRequests": device_requests}})
    if status != 201:
        return Result(1, "", data.decode(errors="replace"), "", ["docker-api", "create"], 0.0)
    cid = json.loads(data)["Id"]
    try:
        status, data = call("POST", f"/v1.45/containers/{cid}/start")
        if status != 204:
            return Result(1, "", data.decode(errors="replace"), "", ["docker-api", "start"], 0.0)
        rc = json.loads(call("POST", f"/v1.45/containers/{cid}/wait")[1])["StatusCode"]
        raw = call("GET", f"/v1.45/containers/{cid}/logs?stdout=1&stderr=1")[1]
        out, err = _demux(raw)
        return Result(rc, out, err, "", ["docker-api", "run"], 0.0)
    finally:
        call("DELETE", f"/v1.45/containers/{cid}?force=1")


def _demux(raw: bytes) -> tuple[str, str]:
    """The API's multiplexed log stream (8-byte frame headers): stdout, stderr."""
    streams = {1: b"", 2: b""}
    while len(raw) >= 8:
        kind, size = raw[0], int.from_bytes(raw[4:8], "big")
        streams[kind] = streams.get(kind, b"") + raw[8:8 + size]
        raw = raw[8 + size:]
    return streams[1].decode(errors="replace"), streams[2].decode(errors="replace")


# --- the verdict for a dockerd with a CDI route (docker 29's; none runs here) ---
def test_cdi_names_of_gpus_values():
    from nvct.doctor.clipaths import cdi_names

    assert cdi_names("docker", "all") == ["nvidia.com/gpu=all"]
    assert cdi_names("docker", '"device=0,GPU-1234"') == ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-1234"]
    assert cdi_names("docker", "device=MIG-abcd,capabilities=utility") == ["nvidia.com/gpu=MIG-abcd"]
    assert cdi_names("docker", "2") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert cdi_names("ctr", "1") == ["nvidia.com/gpu=1"]  # ctr's --gpus names indices


@pytest.fixture
def cdi_dockerd(tmp_path):
    """A process that doctor sees as a dockerd knowing nvidia-cdi-hook, with nvct's on its PATH.

    A copy of this interpreter with the name appended (an ELF ignores trailing bytes).
    """
    import shutil
    import subprocess
    import sys
    import tempfile

    program = tmp_path / "dockerd"
    shutil.copyfile(os.path.realpath(sys.executable), program)
    with open(program, "ab") as f:
        f.write(b"\0nvidia-cdi-hook\0")
    program.chmod(0o755)
    from tests.e2e.conftest import VENV_BIN

    path = _bin(tmp_path / "bin", "nvidia-cdi-hook", "nvidia-container-runtime-hook", "nvct", source=VENV_BIN)
    directory = tempfile.mkdtemp(prefix="nvct-cg-")
    sock = os.path.join(directory, "docker.sock")
    script = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\n"
              "print('ready', flush=True)\nwhile True:\n    s.accept()[0].close()\n")
    proc = subprocess.Popen([str(program), "-c", script, sock], env={"PATH": f"{path}:/usr/bin:/bin"},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield sock, tmp_path
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _host_doctor(sock: str, config: str) -> dict:
    import subprocess

    from tests.e2e.conftest import NVCT

    done = subprocess.run([NVCT, "doctor", "--json", "--docker-socket", sock, "--docker-config", config],
                          capture_output=True, text=True, timeout=120)
    return {f["id"]: f for f in json.loads(done.stdout)["findings"]}["runtime.docker-gpus"]


def test_doctor_names_the_cdi_path_and_checks_its_names_resolve(cdi_dockerd, sim_node):
    import subprocess

    from tests.e2e.conftest import NVCT

    sock, tmp = cdi_dockerd
    specs = tmp / "cdi"
    specs.mkdir()
    config = tmp / "daemon.json"
    config.write_text(json.dumps({"cdi-spec-dirs": [str(specs)]}))
    missing = _host_doctor(sock, str(config))
    assert missing["status"] == "fail", missing
    assert "routes --gpus through CDI" in missing["seen"]
    assert f"docker run --gpus all asks for nvidia.com/gpu=all, which no spec in {specs} defines" in missing["seen"]
    subprocess.run([NVCT, "cdi", "generate", "--output", str(specs / "nvidia.yaml")], check=True, timeout=120,
                   env={**os.environ, "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]}, capture_output=True)
    found = _host_doctor(sock, str(config))
    assert found["status"] == "ok", found
    assert f"docker run --gpus all takes the CDI path: nvidia.com/gpu=all resolve in {specs}" in found["seen"]

    explained = subprocess.run([NVCT, "explain", "--gpus", "device=1", "--docker-socket", sock, "--docker-config",
                                str(config)], capture_output=True, text=True, timeout=120)
    assert explained.returncode == 0, explained.stderr
    assert "the cdi path" in explained.stdout and "CDI devices: nvidia.com/gpu=1" in explained.stdout
    gpu1 = f"/dev/nvidia{sim_node['gpus'][1]['minor']} "
    assert gpu1 in explained.stdout and f"/dev/nvidia{sim_node['gpus'][0]['minor']} " not in explained.stdout
    gone = subprocess.run([NVCT, "explain", "--gpus", "device=GPU-gone", "--docker-socket", sock, "--docker-config",
                           str(config)], capture_output=True, text=True, timeout=120)
    assert gone.returncode == 1 and "error:    the container would not start:" in gone.stdout, gone.stdout

    config.write_text(json.dumps({"cdi-spec-dirs": [str(specs)], "features": {"cdi": False}}))
    hook = _host_doctor(sock, str(config))
    assert hook["status"] == "ok" and "on the hook path" in hook["seen"] and "CDI is disabled" in hook["seen"], hook


def test_podman_5_gpus_names_cdi_devices_by_index(podman5, node, sim_node):
    """podman 5's --gpus N is nvidia.com/gpu=N, GPU N (as ctr's), not a count (as docker's)."""
    _gets(podman5.run(["--rm", "--gpus", "1", BUSYBOX_IMAGE, "sh", "-c", PROBE]), sim_node, [1])
    result = podman5.run(["--rm", "--gpus", "all", BUSYBOX_IMAGE, "sh", "-c", "ls /dev | grep -c '^nvidia[0-9]'"])
    assert result.ok and result.stdout.strip() == str(len(sim_node["gpus"])), result.describe()
    explained = node.nvct("explain", "--cli", "podman", "--gpus", "1")
    assert explained.ok and "CDI devices: nvidia.com/gpu=1 " in explained.stdout, explained.describe()
