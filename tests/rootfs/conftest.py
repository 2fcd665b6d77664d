"""Fixtures of the container-root tests: every operation runs with openat2(2) and with the manual walk."""

from __future__ import annotations

import os

import pytest

from nvct.linux import fs
from nvct.linux.namespaces import mounts
from nvct.rootfs.root import Rootfs
from tests.support.fixtures import skip

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, mknod)")


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Runs a test once with openat2(2) and once with the fallback walk."""
    if request.param == "walk":
        monkeypatch.setattr(fs, "_have_openat2", False)
    elif not fs.openat2_available():
        skip("kernel has no openat2(2); the walk variant covers this test")
    return request.param


@pytest.fixture
def root_dir(tmp_path):
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def root(root_dir, resolver):
    with Rootfs(root_dir) as r:
        yield r


def mount_at(point: str):
    """The last mount at ``point`` in this namespace, or None."""
    found = [m for m in mounts() if m.mount_point == point]
    return found[-1] if found else None
