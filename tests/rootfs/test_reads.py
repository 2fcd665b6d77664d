"""Reading through the root (nvct.rootfs.reads), with both resolvers."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import ContainerError


def test_exists(root, root_dir):
    (root_dir / "file").write_text("x")
    (root_dir / "dangling").symlink_to("/nowhere")
    assert root.exists("/file")
    assert root.exists("/")
    assert not root.exists("/missing")
    assert not root.exists("/file/below")
    assert not root.exists("/dangling")


def test_open_read_file_and_listdir(root, root_dir):
    (root_dir / "etc").mkdir()
    (root_dir / "etc/os-release").write_text("ID=debian\n")
    (root_dir / "link").symlink_to("/etc/os-release")
    assert root.read_file("/link") == b"ID=debian\n"
    assert root.read_file("/etc/os-release", limit=2) == b"ID"
    assert root.listdir("/etc") == ["os-release"]
    with pytest.raises(ContainerError, match="Not a directory"):
        root.listdir("/etc/os-release")


def test_open_refuses_fifos(root, root_dir):
    os.mkfifo(root_dir / "fifo")
    with pytest.raises(ContainerError, match="not a regular file or directory"):
        root.open("/fifo")


def test_realpath_of_the_root(root):
    assert root.realpath("/") == "/"
    assert root.realpath("") == "/"
