"""Resolving paths inside the root (nvct.rootfs.resolve), with both resolvers (openat2 and the manual walk)."""

from __future__ import annotations

import pytest

from nvct.base.errors import ContainerError
from nvct.linux.namespaces import in_private_mount_namespace
from tests.rootfs.conftest import needs_root


def test_absolute_symlink_resolves_inside_root(root, root_dir):
    (root_dir / "real").mkdir()
    (root_dir / "link").symlink_to("/real")
    assert root.realpath("/link") == "/real"
    assert root.realpath("/link/../link") == "/real"


def test_dotdot_in_symlink_is_clamped_at_root(root, root_dir):
    (root_dir / "etc").mkdir()
    (root_dir / "a").mkdir()
    (root_dir / "a" / "up").symlink_to("../../../../../etc")
    assert root.realpath("/a/up") == "/etc"
    assert root.realpath("/../../etc") == "/etc"


def test_symlink_loop_does_not_resolve(root, root_dir):
    (root_dir / "a").symlink_to("b")
    (root_dir / "b").symlink_to("a")
    assert not root.exists("/a")
    with pytest.raises(ContainerError, match="/a/x in container root .*Too many levels"):
        root.makedirs("/a/x")


def test_nul_in_path_is_rejected(root):
    with pytest.raises(ContainerError, match="invalid container path"):
        root.exists("/a\0b")


@needs_root
def test_a_root_opened_in_another_mount_namespace_is_refused(root):
    with pytest.raises(ContainerError, match="opened in another mount namespace"):
        in_private_mount_namespace(root.makedirs, "/x")
