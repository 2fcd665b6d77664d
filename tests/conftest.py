"""Suite-wide settings and simulated GPU nodes.

In CI (NVCT_CI_NO_SKIP=1) a skipped test is a failure.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_nvct_state(tmp_path_factory):
    """``nvct runtime configure`` lists what it configured for package removal
    (nvct.engines.configured): the suite's configs go to a list of its own."""
    os.environ["NVCT_STATE_DIR"] = str(tmp_path_factory.mktemp("nvct-state"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("NVCT_CI_NO_SKIP") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where nothing may be skipped: {reason}"


def _node(tmp_path_factory, **options):
    if os.geteuid() != 0:
        pytest.skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim", **options)


@pytest.fixture(scope="session")
def sim_node(tmp_path_factory):
    """The default simulated node: DGX H100, driver 550.54.15, MIG on GPU 0 (two 3g.40gb)."""
    return _node(tmp_path_factory)


@pytest.fixture(scope="session")
def sim_node_535(tmp_path_factory):
    """Driver 535.161.08, no MIG."""
    return _node(tmp_path_factory, driver_version="535.161.08", mig=False)


@pytest.fixture(scope="session")
def sim_node_570(tmp_path_factory):
    """Driver 570.124.06 (open kernel module era), MIG on GPU 0."""
    return _node(tmp_path_factory, driver_version="570.124.06")


@pytest.fixture(scope="session")
def sim_node_64(tmp_path_factory):
    """The benchmark shape: 64 GPUs on synthetic buses."""
    return _node(tmp_path_factory, gpus=64)
