"""``nvct doctor`` as an operator runs it: a fresh process, options, output, exit status."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.doctor.nodes import GpuNode, clean_env, entry_point, fake_dockerd
from tests.support.fixtures import skip


@pytest.fixture
def node(tmp_path) -> GpuNode:
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")
    return GpuNode(tmp_path)


@pytest.fixture(scope="module")
def nvct(tmp_path_factory) -> str:
    return entry_point("nvct", str(tmp_path_factory.mktemp("bin")))


def _doctor(nvct: str, node: GpuNode, *extra: str, sock: str | None = None) -> subprocess.CompletedProcess:
    args = node.cli_args()
    if sock:
        args[args.index("--docker-socket") + 1] = sock
    return subprocess.run([nvct, *args, *extra], capture_output=True, text=True, env=clean_env(), timeout=60)


def test_a_healthy_node_exits_0_with_one_line_per_finding(nvct, node):
    with fake_dockerd(f"{node.bin}:/usr/bin") as (sock, _):
        text = _doctor(nvct, node, sock=sock)
        data = json.loads(_doctor(nvct, node, "--json", sock=sock).stdout)
    assert text.returncode == 0, text.stdout
    assert data["ok"] is True and data["summary"]["warn"] == data["summary"]["fail"] == 0
    lines = text.stdout.splitlines()
    assert len(lines) == len(data["findings"]) + 1
    assert [line.split()[1] for line in lines[:-1]] == [f["id"] for f in data["findings"]]
    assert lines[-1] == f"doctor: {data['summary']['ok']} ok, {data['summary']['info']} info, 0 warn, 0 fail"


def test_a_broken_node_exits_1_and_names_the_fix(nvct, node):
    os.unlink(node.path("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
    os.unlink(node.path("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"))
    result = _doctor(nvct, node)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("fail")]
    nvml = next(line for line in failed if line.split()[1] == "libraries.nvml")
    assert "lists libnvidia-ml.so.1 => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, which does not exist" in nvml
    assert "-> fix: install driver 550.54.15's utility libraries (libnvidia-ml.so.1), then ldconfig -r" in nvml


def test_the_fix_for_a_stale_cdi_spec_makes_it_fresh(nvct, node):
    spec = os.path.join(node.cdi_dir, "nvidia.yaml")
    with open(spec) as f:
        text = f.read()
    with open(spec, "w") as f:
        f.write(text.replace('- "550.54.15"', '- "535.161.08"'))  # the hook's --host-driver-version
    data = json.loads(_doctor(nvct, node, "--json").stdout)
    stale = [f for f in data["findings"] if f["id"] == "cdi.fresh"]
    assert [f["status"] for f in stale] == ["fail"] and "made for driver 535.161.08" in stale[0]["seen"]
    fix = stale[0]["fix"].split()
    assert fix[:3] == ["nvct", "cdi", "generate"]
    subprocess.run([nvct, "--config", node.config, *fix[1:]], check=True,
                   capture_output=True, env=clean_env(), timeout=60)
    data = json.loads(_doctor(nvct, node, "--json").stdout)
    assert [f["status"] for f in data["findings"] if f["id"] == "cdi.fresh"] == ["ok"]


def test_the_fix_for_missing_dev_char_links_restores_them(nvct, node):
    for name in ("195:0", "195:255", "510:0"):
        os.unlink(node.path(f"dev/char/{name}"))
    data = json.loads(_doctor(nvct, node, "--json").stdout)
    links = [f for f in data["findings"] if f["id"] == "devices.char-links"]
    assert [f["status"] for f in links] == ["warn"]
    fix = links[0]["fix"].split()
    assert fix[:4] == ["nvct", "system", "create-dev-char-symlinks", "--create-all"]
    subprocess.run([nvct, "--config", node.config, *fix[1:]], check=True, capture_output=True, env=clean_env(),
                   timeout=60)
    data = json.loads(_doctor(nvct, node, "--json").stdout)
    assert [f["status"] for f in data["findings"] if f["id"] == "devices.char-links"] == ["ok"]


def test_deep_queries_nvml_per_gpu(nvct, node):
    data = json.loads(_doctor(nvct, node, "--json", "--deep").stdout)
    statuses = {f["id"]: f["status"] for f in data["findings"]}
    assert statuses["driver.nvml-devices"] == "ok" and statuses["devices.persistence"] == "ok"


def test_several_cdi_dirs_are_read(nvct, node, tmp_path):
    other = tmp_path / "other-cdi"
    other.mkdir()
    data = json.loads(_doctor(nvct, node, "--json", "--cdi-dir", str(other)).stdout)
    specs = [f for f in data["findings"] if f["id"] == "cdi.specs"]
    assert specs[0]["seen"].startswith(f"1 NVIDIA spec(s) in {node.cdi_dir}, {other} ")


def test_a_wrong_driver_root_fails_once_and_the_checks_that_need_it_say_why_they_were_skipped(nvct, node):
    wrong = os.path.join(node.tmp, "run/nvidia/driver")
    with open(node.config) as f:
        text = f.read()
    with open(node.config, "w") as f:
        f.write(text.replace(f'root = "{node.dir}"', f'root = "{wrong}"'))  # the driver and dev roots
    result = _doctor(nvct, node)
    assert result.returncode == 1
    lines = {line.split()[1]: line for line in result.stdout.splitlines()[:-1]}
    failed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("fail")]
    assert failed == ["config.roots", "config.roots"]
    driver_root = f"the driver root {wrong} (nvidia-container-cli.root) does not exist (see config.roots)"
    dev_root = f"the dev root {wrong} (nvct.dev-root) does not exist (see config.roots)"
    for check, why in (("driver.nvml", driver_root), ("libraries.ldcache", driver_root),
                       ("devices.nodes", dev_root), ("devices.modes", dev_root), ("devices.char-links", dev_root)):
        status, _, seen = lines[check].split(None, 2)
        assert (status, seen) == ("info", f"not checked: {why}")


def test_toolkit_dir_finds_a_stale_stand_in_and_the_fix_prunes_it(nvct, node, tmp_path):
    from nvct.toolkit import standin

    toolkit = tmp_path / "toolkit"
    toolkit.mkdir()
    path = toolkit / "nvidia-container-runtime"
    path.write_text(standin.script(str(path), ["runc"]))
    path.chmod(0o755)
    found = json.loads(_doctor(nvct, node, "--json", "--toolkit-dir", str(toolkit)).stdout)["findings"]
    (finding,) = [f for f in found if f["id"] == "toolkit.standins"]
    command = finding["fix"].split(" (", 1)[0]
    assert finding["status"] == "warn" and command == f"nvct toolkit prune-standins {path}"
    pruned = subprocess.run([nvct, *command.split()[1:]], capture_output=True, text=True, env=clean_env(),
                            timeout=60)
    assert (pruned.returncode, pruned.stdout) == (0, f"removed {path}\n"), pruned.stderr
    assert not toolkit.exists()
    found = json.loads(_doctor(nvct, node, "--json", "--toolkit-dir", str(toolkit)).stdout)["findings"]
    assert [f["status"] for f in found if f["id"] == "toolkit.standins"] == ["ok"]
