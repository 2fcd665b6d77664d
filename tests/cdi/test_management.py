"""The management spec names each GPU and MIG device, not only ``all``.

Device plugins in CDI mode (Volcano's, the GPU Operator's in some setups)
annotate pods with ``management.nvidia.com/gpu=GPU-<uuid>``: a spec with
``all`` alone leaves such pods unstartable ("unresolvable CDI devices").
A per-GPU management device is what the GPU spec's device of that name
gives, with the control nodes; the MIG config/monitor capabilities stay
``all``'s alone (they reconfigure every GPU).
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from nvct.cdi import generate, spec
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED
from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor

from . import e2e
from .conftest import node_driver

HOOK = "/usr/bin/nvidia-cdi-hook"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}


def _devices(raw) -> dict[str, set[str]]:
    return {d["name"]: {n["path"] for n in d["containerEdits"].get("deviceNodes", [])} for d in raw["devices"]}


def _mig_config_caps(node) -> set[str]:
    return {n["path"] for n in node["device_nodes"] if n["role"] in ("mig-config", "mig-monitor")}


def test_every_gpu_and_mig_device_has_its_names_beside_all(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, vendor="management.nvidia.com", mode="management")
    spec.validate(raw)
    devices = _devices(raw)
    expected = {"all"}
    for gpu in node["gpus"]:
        expected |= {str(gpu["index"]), gpu["uuid"]}
        for mig in gpu["mig_devices"]:
            expected |= {f"{gpu['index']}:{mig['index']}", mig["uuid"]}
    assert set(devices) == expected
    for gpu in node["gpus"]:
        nvidia = {p for p in devices[gpu["uuid"]] if not p.startswith("/dev/dri/")}
        assert nvidia == CONTROL | {gpu["device_node"]}
        assert devices[str(gpu["index"])] == devices[gpu["uuid"]]
        for mig in gpu["mig_devices"]:
            assert devices[mig["uuid"]] == CONTROL | {gpu["device_node"],
                                                      f"/dev/nvidia-caps/nvidia-cap{mig['gi_cap_minor']}",
                                                      f"/dev/nvidia-caps/nvidia-cap{mig['ci_cap_minor']}"}
    # all: every NVIDIA node, as before; the common edits carry none (they would reach every device).
    assert devices["all"] == {n["path"] for n in node["device_nodes"] if n["role"] != "dri"}
    assert "deviceNodes" not in raw["containerEdits"]


def test_the_mig_config_and_monitor_capabilities_are_alls_alone(node):
    caps = _mig_config_caps(node)
    raw = generate.generate(node_driver(node), hook_path=HOOK, mode="management")
    devices = _devices(raw)
    assert caps and caps <= devices.pop("all")
    assert not any(caps & nodes for nodes in devices.values())


@pytest.mark.parametrize("device_ids, strategies, names", [
    (("1",), ("index", "uuid"), lambda n: {"all", "1", n["gpus"][1]["uuid"]}),
    (("none",), ("index", "uuid"), lambda n: {"all"}),
    (("all",), ("type-index",), lambda n: {"all", *(f"gpu{g['index']}" for g in n["gpus"]),
                                           *(f"mig{g['index']}:{m['index']}" for g in n["gpus"]
                                             for m in g["mig_devices"])}),
])
def test_device_ids_and_strategies_choose_the_per_gpu_devices(node, device_ids, strategies, names):
    raw = generate.generate(node_driver(node), hook_path=HOOK, mode="management", device_ids=device_ids,
                            strategies=strategies)
    assert set(_devices(raw)) == names(node)


def _management_spec(entry_points, node, vendor: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    proc = subprocess.run([entry_points["nvct"], "cdi", "generate", "--mode", "management", "--vendor", vendor,
                           "--nvidia-cdi-hook-path", entry_points["nvct"]],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def management_vendor(private_podman, node, entry_points):
    """A management spec of the node in /var/run/cdi under a vendor of its own, for the module."""
    vendor = unique_cdi_vendor()
    text = _management_spec(entry_points, node, vendor)
    spec.validate(yaml.safe_load(text))
    with cdi_spec(text, directory=CDI_DIRS[1], suffix=".yaml"):
        yield vendor


@pytest.mark.parametrize("pick", ["gpu-uuid", "gpu-index", "mig-uuid"])
def test_podman_gives_exactly_the_gpu_named(private_podman, management_vendor, node, pick):
    """``--device <vendor>/gpu=GPU-<uuid>`` (a device plugin's request): that GPU's nodes, its UUID in
    nvidia-smi -L, the driver's libraries; nothing of the other GPUs."""
    gpu = node["gpus"][1]
    name, seen = {"gpu-uuid": (gpu["uuid"], "1"), "gpu-index": ("1", "1"),
                  "mig-uuid": (node["gpus"][0]["mig_devices"][0]["uuid"], "0:0")}[pick]
    result = private_podman.run(["--rm", "--device", f"{management_vendor}/gpu={name}", BUSYBOX_IMAGE_QUALIFIED,
                                 "sh", "-c", e2e.CHECK_SCRIPT])
    e2e.assert_container_sees(result, node, seen)
