"""Fixtures: a fresh healthy node per test (tests break it), and an older driver's node to borrow from."""

from __future__ import annotations

import os

import pytest

from tests.support.fixtures import busybox_image_tar, pause_image_tar, rootfs, skip  # noqa: F401 - fixtures

from .nodes import GpuNode


def _need_root() -> None:
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")


@pytest.fixture
def node(tmp_path) -> GpuNode:
    """A healthy DGX H100 node with driver 550.54.15, engines and CDI set up."""
    _need_root()
    return GpuNode(tmp_path)


@pytest.fixture(scope="session")
def node535(tmp_path_factory) -> dict:
    """Another driver version's node (read-only: libraries and specs are taken from it)."""
    _need_root()
    from nvct.simulate import cached_node

    return cached_node(tmp_path_factory.mktemp("doctor-nodes"), driver_version="535.161.08", mig=False)
