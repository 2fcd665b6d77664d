"""No test writes the host's /run: the suite runs in a mount namespace of its own (tests.support.hostns).

Seen from outside it: the host's /run, opened before the namespace was entered, is looked at
through that descriptor after a GPU container started through the shim inside the suite. Other
runs on the machine may write there meanwhile: what this start wrote names its own config file.
"""

from __future__ import annotations

import os

import pytest

from tests.support import hostns
from tests.support.fixtures import need_root, rootfs  # noqa: F401 - a fixture
from tests.support.gpu_runs import need_runtime, run_gpu


def _naming(top: str, text: str) -> list[str]:
    """The files under ``top`` that hold ``text``."""
    found = []
    for dirpath, _, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    if text.encode() in f.read():
                        found.append(path)
            except OSError:  # a socket, a file another run just replaced
                pass
    return found


def _private() -> None:
    need_root("the suite's private mount namespace is root's")
    assert hostns.is_private(), "the suite runs on the host's /run (tests/conftest.py enters its own)"


def test_the_suite_has_its_own_run_showing_the_hosts_entries_but_nvcts():
    _private()
    host = set(os.listdir(f"/proc/self/fd/{hostns.host_run}"))
    assert set(os.listdir("/run")) >= host - set(hostns.HIDDEN)


@pytest.mark.containers
def test_a_gpu_start_in_the_suite_writes_nothing_of_its_own_in_the_hosts_run(tmp_path, sim_node, rootfs):
    _private()
    need_runtime("runc")
    result = run_gpu(tmp_path, sim_node, rootfs, mode="legacy", env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="test -c /dev/nvidia0")
    assert result.ok, result.describe()
    config = os.path.join(str(tmp_path), "config.toml")  # run_gpu's, a path no other run has
    assert _naming("/run/nvct", config)  # the start recorded it for the fronts, in the suite's /run
    host = f"/proc/self/fd/{hostns.host_run}"
    assert [p[len(host):] for name in hostns.HIDDEN for p in _naming(f"{host}/{name}", config)] == []
