"""Fixtures for the installer's tests: a simulated GPU node and the images the daemons run."""

from __future__ import annotations

import pytest

from tests.support.fixtures import busybox_image_tar, need_root, pause_image_tar  # noqa: F401


@pytest.fixture(scope="session")
def sim_node(tmp_path_factory):
    """The default simulated node (DGX H100, driver 550), shared with the other suites' fixtures."""
    need_root("builds a simulated GPU node (mknod)")
    from nvct.simulate.node import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim")
