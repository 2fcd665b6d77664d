"""Names the simulate tests use for the suite-wide simulated nodes (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, ldconfig -r)")


@pytest.fixture(scope="session")
def node550(sim_node):
    return sim_node


@pytest.fixture(scope="session")
def node535(sim_node_535):
    return sim_node_535


@pytest.fixture(scope="session")
def node570(sim_node_570):
    return sim_node_570


@pytest.fixture(scope="session")
def node64(sim_node_64):
    return sim_node_64
