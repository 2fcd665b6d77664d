"""Podman 4.3 runs containers with devices from a spec ``nvct cdi generate`` wrote.

Podman reads only /etc/cdi and /var/run/cdi: the spec goes there under a
vendor no other spec uses, and is always removed afterwards.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import VENV_BIN
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED
from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor

from . import e2e


@pytest.fixture(scope="module")
def podman_cdi(private_podman, node, entry_points):
    """(podman, vendor) with the node's generated spec in /var/run/cdi for the module."""
    vendor = unique_cdi_vendor()
    with cdi_spec(e2e.generate_spec_text(entry_points, node, vendor), directory=CDI_DIRS[1],
                  suffix=".yaml"):
        yield private_podman, vendor


@pytest.mark.parametrize("device", e2e.DEVICES)
def test_podman_run_with_a_cdi_device(podman_cdi, node, device):
    podman, vendor = podman_cdi
    result = podman.run(["--rm", "--device", f"{vendor}/gpu={device}", BUSYBOX_IMAGE_QUALIFIED,
                         "sh", "-c", e2e.CHECK_SCRIPT])
    e2e.assert_container_sees(result, node, device)


def test_podman_reads_a_spec_in_etc_cdi_too(private_podman, node, entry_points):
    vendor = unique_cdi_vendor()
    with cdi_spec(e2e.generate_spec_text(entry_points, node, vendor), directory=CDI_DIRS[0], suffix=".yaml"):
        result = private_podman.run(["--rm", "--device", f"{vendor}/gpu=1", BUSYBOX_IMAGE_QUALIFIED,
                                     "sh", "-c", e2e.CHECK_SCRIPT])
    e2e.assert_container_sees(result, node, "1")


def test_podman_runs_a_spec_from_nvidia_ctk_naming_nvidia_cdi_hook(private_podman, node, entry_points):
    """``nvidia-ctk cdi generate --nvidia-cdi-hook-path .../nvidia-cdi-hook`` (as the GPU Operator
    runs it): the chain runs under that program, MPS mount included."""
    vendor = unique_cdi_vendor()
    text = e2e.generate_spec_text(entry_points, node, vendor, program=os.path.join(VENV_BIN, "nvidia-ctk"),
                                  hook_path=os.path.join(VENV_BIN, "nvidia-cdi-hook"))
    assert "nvidia-cdi-hook" in text
    with cdi_spec(text, directory=CDI_DIRS[1], suffix=".yaml"):
        result = private_podman.run(["--rm", "--device", f"{vendor}/gpu=0", BUSYBOX_IMAGE_QUALIFIED,
                                     "sh", "-c", e2e.CHECK_SCRIPT])
    e2e.assert_container_sees(result, node, "0")


def _generate(entry_points, node, vendor: str, *args) -> str:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    proc = subprocess.run([entry_points["nvct"], "cdi", "generate", "--vendor", vendor, *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("mode, nodes", [
    ("gds", {"/dev/nvidia-fs0", "/dev/nvidia-fs1"}),
    ("mofed", {"/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"}),
    ("gdrcopy", {"/dev/gdrdrv"}),
    ("nvswitch", {"/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch0", "/dev/nvidia-nvswitch1"}),
])
def test_podman_applies_a_subsystem_modes_spec(private_podman, gated_node, entry_points, mode, nodes):
    """``cdi generate --mode <subsystem>``: the container has exactly that subsystem's nodes (and GDS's files)."""
    vendor = unique_cdi_vendor()
    with cdi_spec(_generate(entry_points, gated_node, vendor, "--mode", mode, "--class", mode),
                  directory=CDI_DIRS[1], suffix=".yaml"):
        result = private_podman.run(["--rm", "--device", f"{vendor}/{mode}=all", BUSYBOX_IMAGE_QUALIFIED, "sh", "-c",
                                     "find /dev -type c | sort; echo ==; cat /etc/cufile.json; "
                                     "grep -c ' /run/udev ' /proc/self/mountinfo; true"])
    assert result.ok, result.describe()
    devices, _, rest = result.stdout.partition("==\n")
    found = {p for p in devices.split() if not p.startswith(("/dev/null", "/dev/zero", "/dev/full", "/dev/tty",
                                                              "/dev/random", "/dev/urandom", "/dev/console",
                                                              "/dev/ptmx", "/dev/pts/"))}
    assert found == nodes, result.describe()
    if mode == "gds":
        assert rest.startswith('{"logging"') and rest.split()[-1] == "1", result.describe()
    else:
        assert "logging" not in rest, result.describe()


def test_podman_applies_an_imex_channel_spec(private_podman, gated_node, entry_points):
    vendor = unique_cdi_vendor()
    with cdi_spec(_generate(entry_points, gated_node, vendor, "--mode", "imex", "--class", "imex-channel"),
                  directory=CDI_DIRS[1], suffix=".yaml"):
        result = private_podman.run(["--rm", "--device", f"{vendor}/imex-channel=1", BUSYBOX_IMAGE_QUALIFIED,
                                     "sh", "-c", "find /dev/nvidia-caps-imex-channels -type c; "
                                     "ls /dev/nvidia0 || true"])
    assert result.ok, result.describe()
    assert result.stdout.split()[0] == "/dev/nvidia-caps-imex-channels/channel1", result.describe()
    assert "channel0" not in result.stdout and "/dev/nvidia0\n" not in result.stdout, result.describe()
