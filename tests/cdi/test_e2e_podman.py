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
