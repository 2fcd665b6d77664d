"""Simulated nodes shared by the tests in this package (built once per session).

Other test packages: call ``nvct.simulate.cached_node(base_dir, **options)``
from your own session fixture; it reuses a node built with the same options.
"""

from __future__ import annotations

import os

import pytest

from nvct.simulate import cached_node

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, ldconfig -r)")


@pytest.fixture(scope="session")
def sim_base(tmp_path_factory):
    return tmp_path_factory.mktemp("simnodes")


def _node(sim_base, **options):
    if os.geteuid() != 0:
        pytest.skip("needs root (mknod, ldconfig -r)")
    return cached_node(sim_base, **options)


@pytest.fixture(scope="session")
def node550(sim_base):
    """The default node: DGX H100, driver 550.54.15, MIG on GPU 0."""
    return _node(sim_base)


@pytest.fixture(scope="session")
def node535(sim_base):
    """Driver 535.161.08 (195 is still 'nvidia-frontend'), MIG off."""
    return _node(sim_base, driver_version="535.161.08", mig=False)


@pytest.fixture(scope="session")
def node570(sim_base):
    return _node(sim_base, driver_version="570.124.06")


@pytest.fixture(scope="session")
def node64(sim_base):
    """The benchmark shape: 64 GPUs on synthetic buses."""
    return _node(sim_base, gpus=64)
