"""Driver discovery on simulated nodes, against each node's own ground truth."""

import json
import os
import subprocess
import sys

import pytest

from nvct.config import file as config_mod
from nvct.discover.driver import Driver
from tests.support.fixtures import skip

NVCT = os.path.join(os.path.dirname(sys.executable), "nvct")


def nvct_list(node) -> dict:
    out = subprocess.run([NVCT, "--config", node["config"], "list", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _norm(items, keys):
    return sorted(json.dumps({k: i[k] for k in keys}, sort_keys=True) for i in items)


@pytest.mark.parametrize("fixture", ["sim_node", "sim_node_535", "sim_node_570"])
def test_nvct_list_matches_the_nodes_ground_truth(request, fixture):
    node = request.getfixturevalue(fixture)
    listed = nvct_list(node)
    assert listed["driver_version"] == node["driver_version"]
    assert _norm(listed["libraries"], ("path", "soname", "capability", "arch")) == \
        _norm(node["libraries"], ("path", "soname", "capability", "arch"))
    assert _norm(listed["binaries"], ("path", "capability")) == _norm(node["binaries"], ("path", "capability"))
    assert _norm(listed["device_nodes"], ("path", "major", "minor", "mode", "role")) == \
        _norm(node["device_nodes"], ("path", "major", "minor", "mode", "role"))
    for lib in listed["libraries"]:  # the file's own ELF facts agree with the cache entry
        machine = {"x86_64": "x86_64", "i386": "i386"}[lib["arch"]]
        assert lib["elf"] == {"class": 64 if machine == "x86_64" else 32, "machine": machine,
                              "soname": lib["soname"]}, lib
    assert sorted(listed["ipc"]) == sorted(node["ipc"])
    assert sorted(listed["firmware"]) == sorted(node["firmware"])


@pytest.mark.parametrize("fixture", ["sim_node", "sim_node_535"])
def test_gpus_and_mig_devices_from_procfs_and_nvml(request, fixture):
    node = request.getfixturevalue(fixture)
    driver = Driver.from_config(config_mod.load(node["config"]))
    assert [(g.index, g.minor, g.uuid, g.bus_id) for g in driver.gpus] == \
        [(g["index"], g["minor"], g["uuid"], g["bus_id"]) for g in node["gpus"]]
    for gpu, truth in zip(driver.gpus, node["gpus"]):
        assert [(m.gi, m.ci, m.gi_cap_minor, m.ci_cap_minor) for m in gpu.migs] == \
            [(m["gi"], m["ci"], m["gi_cap_minor"], m["ci_cap_minor"]) for m in truth["mig_devices"]]
    expected_uuids = {m["uuid"]: (g["index"], m["index"]) for g in node["gpus"] for m in g["mig_devices"]}
    assert driver.mig_uuids == expected_uuids


def test_procfs_enumeration_opens_no_device_node(sim_node, tmp_path):
    # Device nodes of the simulated node are real char devices of an absent driver:
    # opening one fails with ENXIO. Discovery must not need to.
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    assert len(driver.gpus) == 8
    assert driver.control_nodes()[0].path == "/dev/nvidiactl"


def test_capability_selection(sim_node):
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    utility = {os.path.basename(lib.path) for lib in driver.libraries(["utility"])}
    assert utility == {"libnvidia-ml.so.550.54.15", "libnvidia-cfg.so.550.54.15"}
    compute = driver.libraries(["compute"])
    assert all(lib.arch == "x86_64" for lib in compute)
    compat = driver.libraries(["compute"], compat32=True)
    assert {lib.arch for lib in compat} == {"x86_64", "i386"}


def test_tls_library_needs_the_new_abi_note(sim_node, tmp_path):
    # libnvidia-container's rule: libnvidia-tls only with an ELF note "Linux 2.3.99".
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    tls = [lib for lib in driver.libraries(["graphics"]) if lib.soname.startswith("libnvidia-tls")]
    assert tls and all(driver._tls_abi_ok(lib) for lib in tls)
    plain = tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-tls.so.550.54.15"
    plain.parent.mkdir(parents=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(plain), "-Wl,-soname,libnvidia-tls.so.550.54.15",
                    "-x", "c", "/dev/null"], check=True)
    other = Driver(str(tmp_path), driver.dev_root, driver.proc_root)
    assert not other._tls_abi_ok(tls[0])


@pytest.fixture(scope="module")
def grace_node(tmp_path_factory):
    if os.geteuid() != 0:
        skip("needs root (builds a simulated GPU node with mknod, registers binfmt_misc)")
    from tests.support import arm64

    return arm64.grace_node(tmp_path_factory.getbasetemp() / "sim")


def test_nvct_list_on_an_aarch64_node_matches_its_ground_truth(grace_node):
    # Before: the x86_64/i386 filter listed no library at all on an arm64 node, and said nothing.
    listed = nvct_list(grace_node)
    assert listed["libraries"], "no driver library found on the aarch64 node"
    assert _norm(listed["libraries"], ("path", "soname", "capability", "arch")) == \
        _norm(grace_node["libraries"], ("path", "soname", "capability", "arch"))
    for lib in listed["libraries"]:
        assert lib["arch"] == "aarch64" and lib["path"].startswith("/usr/lib/aarch64-linux-gnu/"), lib
        assert lib["elf"] == {"class": 64, "machine": "aarch64", "soname": lib["soname"]}, lib
    assert _norm(listed["device_nodes"], ("path", "major", "minor", "mode", "role")) == \
        _norm(grace_node["device_nodes"], ("path", "major", "minor", "mode", "role"))


def test_the_architecture_is_the_nodes_own(sim_node, grace_node):
    x86 = Driver.from_config(config_mod.load(sim_node["config"]))
    arm = Driver.from_config(config_mod.load(grace_node["config"]))
    assert (x86.arch, x86.arches) == ("x86_64", ("x86_64", "i386"))
    assert (arm.arch, arm.arches) == ("aarch64", ("aarch64",))
    every = ["utility", "compute", "video", "graphics", "ngx"]
    # The same capabilities as on x86-64 (the same library names), none 32-bit on arm64.
    names = {lib.soname for lib in arm.libraries(every, compat32=True)}
    assert names == {lib.soname for lib in x86.libraries(every)}
    assert all(not lib.compat32 for lib in arm.libraries(every, compat32=True))
    assert {lib.soname for lib in arm.libraries(["compute"])} >= {"libcuda.so.1"}


def test_without_driver_libraries_in_the_cache_the_architecture_is_this_machines(sim_node, tmp_path):
    (tmp_path / "etc").mkdir()
    subprocess.run(["ldconfig", "-X", "-r", str(tmp_path)], check=True)  # an empty cache
    driver = Driver(str(tmp_path), sim_node["roots"]["dev_root"], sim_node["roots"]["proc_root"])
    assert driver.arch == {"arm64": "aarch64"}.get(os.uname().machine, os.uname().machine)
    assert driver.libraries(["compute"]) == []


def test_nvml_of_another_architecture_says_so(grace_node):
    from nvct.base.errors import DriverError

    driver = Driver.from_config(config_mod.load(grace_node["config"]))
    if os.uname().machine == "aarch64":
        skip("this machine is aarch64: its NVML loads")
    with pytest.raises(DriverError, match=r"libnvidia-ml\.so\.1: cannot load NVML: an aarch64 library, "
                                          r"and this machine is x86_64"):
        driver.nvml()


def test_utilities_are_looked_for_on_path_first_and_must_be_executable(tmp_path, monkeypatch):
    """The driver in its own folder with a wrapper script of the same name in /usr/bin (a real H200
    node's layout, and GKE's): PATH names the folder, and NVIDIA's lookup takes PATH first."""
    root = tmp_path / "root"
    for path, mode in (("usr/bin/nvidia-smi", 0o755), ("usr/local/nvidia/bin/nvidia-smi", 0o755),
                       ("usr/bin/nvidia-debugdump", 0o644), ("usr/sbin/nvidia-debugdump", 0o755)):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("#!/bin/sh\n")
        (root / path).chmod(mode)
    config = tmp_path / "config.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{root}"\n')
    driver = Driver.from_config(config_mod.load(str(config)))
    monkeypatch.setenv("PATH", "relative/bin:/usr/local/nvidia/bin/:/usr/bin")
    assert driver.binaries(["utility"]) == ["/usr/local/nvidia/bin/nvidia-smi", "/usr/sbin/nvidia-debugdump"]
    monkeypatch.setenv("PATH", "/usr/bin")
    assert driver.binaries(["utility"]) == ["/usr/bin/nvidia-smi", "/usr/sbin/nvidia-debugdump"]
