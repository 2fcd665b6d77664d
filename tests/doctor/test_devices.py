"""devices.*: majors, nodes, modes, /dev/char links, persistence mode."""

from __future__ import annotations

import os
import shutil
import subprocess

from nvct import doctor
from tests.support.fixtures import skip

from .nodes import GpuNode, needs_root, one, problems, write


def test_no_device_nodes_warns_with_the_mknod_commands(node):
    for entry in os.listdir(node.path("dev")):
        if entry.startswith("nvidia"):
            path = node.path(f"dev/{entry}")
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    findings = node.doctor()
    nodes = one(findings, "devices.nodes")
    # Containers still get every node (tests/doctor/test_verdicts.py): a warning, not a failure.
    assert nodes.status == "warn"
    # nvidia-modeset is optional: without its node it is not expected.
    assert nodes.seen.startswith(f"15 of 15 device nodes missing under {node.dir}: /dev/nvidiactl, ")
    assert "Containers still get them" in nodes.seen and "do not see the driver (no /dev/nvidiactl)" in nodes.seen
    assert f"mknod -m 666 {node.path('dev/nvidiactl')} c 195 255" in nodes.fix
    assert f"mknod -m 666 {node.path('dev/nvidia7')} c 195 7" in nodes.fix
    assert f"mkdir -p {node.path('dev/nvidia-caps')}" in nodes.fix
    assert doctor.exit_code(findings) == 0


@needs_root
def test_the_mknod_fix_repairs_the_node(node):
    os.unlink(node.path("dev/nvidia3"))
    fix = one(node.doctor(), "devices.nodes").fix
    assert fix == f"mknod -m 666 {node.path('dev/nvidia3')} c 195 3"
    subprocess.run(fix, shell=True, check=True)
    assert one(node.doctor(), "devices.nodes").status == "ok"


def test_a_node_with_the_wrong_numbers_is_named(node):
    os.unlink(node.path("dev/nvidia2"))
    os.mknod(node.path("dev/nvidia2"), 0o20666, os.makedev(195, 5))
    nodes = one(node.doctor(), "devices.nodes")
    assert nodes.status == "warn"
    assert nodes.seen.startswith(f"{node.path('dev/nvidia2')} is c 195:5, expected c 195:2. Containers still get")
    assert nodes.fix == f"rm {node.path('dev/nvidia2')} && mknod -m 666 {node.path('dev/nvidia2')} c 195 2"


def test_a_missing_dev_char_link_warns_with_the_symlink_command(node):
    os.unlink(node.path("dev/char/195:0"))
    findings = node.doctor()
    links = one(findings, "devices.char-links")
    assert links.status == "warn"
    assert f"no {node.path('dev/char')}/M:m link for 195:0:" in links.seen
    assert "systemctl daemon-reload" in links.seen
    assert links.fix == f"nvct system create-dev-char-symlinks --create-all --dev-root {node.dir}"
    assert doctor.exit_code(findings) == 0  # a warning: containers start, they break later


def test_a_dev_char_link_to_the_wrong_node_counts_as_missing(node):
    os.unlink(node.path("dev/char/195:1"))
    os.symlink("../nvidia2", node.path("dev/char/195:1"))
    assert "link for 195:1:" in one(node.doctor(), "devices.char-links").seen


def test_a_node_closed_to_other_users_warns(node):
    os.chmod(node.path("dev/nvidia1"), 0o660)
    modes = one(node.doctor(), "devices.modes")
    assert modes.status == "warn"
    assert modes.seen.startswith(f"{node.path('dev/nvidia1')} has mode 0660: non-root container users")
    assert modes.fix.startswith(f"chmod 0666 {node.path('dev/nvidia1')}")


def test_missing_uvm_module_warns(node):
    with open(node.path("proc/devices")) as f:
        text = f.read()
    write(node.path("proc/devices"), text.replace("510 nvidia-uvm\n", ""))
    majors = one(node.doctor(), "devices.majors")
    assert majors.status == "warn" and majors.fix == "modprobe nvidia-uvm"


def test_persistence_mode_is_only_queried_when_deep(node):
    shallow = one(node.doctor(), "devices.persistence")
    assert shallow.status == "info" and "--deep" in shallow.seen
    deep = one(node.doctor(deep=True), "devices.persistence")
    assert deep.status == "ok"


def test_a_node_built_without_device_nodes_warns_about_nodes_and_nvml(tmp_path):
    if os.geteuid() != 0:

        skip("needs root (ldconfig -r, and GpuNode's other setup)")
    bare = GpuNode(tmp_path, device_nodes=False, mig=False)
    found = {f.id: f.status for f in problems(bare.doctor())}
    assert found["devices.nodes"] == found["driver.nvml"] == "warn"
    assert "cdi.fresh" not in found  # a spec's nodes carry their numbers: runtimes make them


def _without_dev_root(node) -> None:
    """The GPU Operator's config: only the driver root; the dev root follows it."""
    with open(node.config) as f:
        text = f.read()
    write(node.config, text.replace(f'dev-root = "{node.dir}"\n', ""))


def test_nodes_only_in_the_host_dev_say_to_set_the_dev_root(node, tmp_path, monkeypatch):
    """Dev root = driver root (no nvct.dev-root), nodes only in the host's /dev: the fix points nvct there."""
    from nvct.doctor import devices

    _without_dev_root(node)
    host = tmp_path / "host"
    host.mkdir()
    os.rename(node.path("dev"), host / "dev")  # the nodes are in the host's /dev only
    os.makedirs(node.path("dev"))
    monkeypatch.setattr(devices, "HOST_ROOT", str(host))
    nodes = one(node.doctor(), "devices.nodes")
    assert nodes.status == "warn"
    assert "(dev root: the driver root, as nvct.dev-root is not set). Containers still get them" in nodes.seen
    assert nodes.fix == f"nvct config -c {node.config} --set nvct.dev-root=/ -i (the nodes are in the host's /dev)"


def test_nodes_in_both_roots_the_driver_roots_are_used_and_doctor_says_so(node, tmp_path, monkeypatch):
    from nvct.doctor import devices

    _without_dev_root(node)
    host = tmp_path / "host"
    host.mkdir()
    subprocess.run(["cp", "-a", node.path("dev"), str(host / "dev")], check=True)  # the same nodes in both
    monkeypatch.setattr(devices, "HOST_ROOT", str(host))
    findings = node.doctor()
    roots = one(findings, "config.roots")
    assert roots.status == "ok"
    assert roots.seen == (f"driver root {node.dir}, dev root {node.dir} (the driver root, as nvct.dev-root is not "
                          f"set), proc root {node.path('proc')}; the host's /dev also holds NVIDIA nodes, which "
                          "nvct does not use (see docs/configuration.md)")
    assert one(findings, "devices.nodes").status == "ok"
