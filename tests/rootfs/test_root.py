"""Rootfs: opening a container root once, and refusing roots that are not what they seem."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import ContainerError
from nvct.linux import fs
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.rootfs import root as rootfs
from nvct.rootfs.root import Rootfs
from tests.rootfs.conftest import needs_root


def test_missing_root_is_a_one_line_error(tmp_path):
    with pytest.raises(ContainerError, match="container root .*missing: No such file"):
        Rootfs(tmp_path / "missing")


@pytest.mark.parametrize("where", ["root", "parent"])
def test_a_root_path_through_a_symlink_is_refused(resolver, tmp_path, where):
    """runc's rule, applied before anything is written: the link's target stays untouched."""
    (tmp_path / "real/root").mkdir(parents=True)
    if where == "root":
        (tmp_path / "link").symlink_to(tmp_path / "real/root")
        path = tmp_path / "link"
    else:
        (tmp_path / "via").symlink_to(tmp_path / "real")
        path = tmp_path / "via/root"
    with pytest.raises(rootfs.UnsafeRootError, match=f"container root {path}: its path leads through a symlink"):
        Rootfs(path)


def test_a_root_that_is_no_directory_is_refused(resolver, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(rootfs.UnsafeRootError, match="not a directory"):
        Rootfs(tmp_path / "file")


def test_a_relative_root_path_is_refused(resolver):
    with pytest.raises(rootfs.UnsafeRootError, match="not an absolute path"):
        Rootfs("rootfs")


@needs_root
def test_a_root_is_owned_by_root_or_the_container_root_user(resolver, root_dir):
    os.chown(root_dir, 4242, 4242)
    with pytest.raises(rootfs.UnsafeRootError, match=f"container root {root_dir}: owned by uid 4242"):
        Rootfs(root_dir)
    with Rootfs(root_dir, owners=(4242,)) as root:  # the uid a user namespace maps to root
        assert root.exists("/")


def _open_over(root_dir: str, other: str, identity) -> str:
    fs.mount(other, root_dir, None, fs.MS_BIND)  # as crun does when the owner swapped root.path
    try:
        Rootfs(root_dir, same_as=identity)
    except rootfs.UnsafeRootError as e:
        return str(e)
    finally:
        fs.umount(root_dir, fs.MNT_DETACH)
    return "opened"


@needs_root
def test_a_root_the_runtime_mounted_another_directory_over_is_refused(resolver, root_dir, tmp_path):
    """The legacy hook's root in the container's mount namespace must be the directory verified on the host."""
    (tmp_path / "host").mkdir()
    identity = rootfs.root_identity(str(root_dir))
    with Rootfs(root_dir, same_as=identity) as root:
        assert root.exists("/")
    text = in_private_mount_namespace(_open_over, str(root_dir), str(tmp_path / "host"), identity)
    assert text == (f"container root {root_dir}: the runtime set up another directory there than the one "
                    "verified on the host (its path was swapped while the runtime resolved it); "
                    "refusing to write into it")


def test_the_root_stays_the_one_opened(root, root_dir, tmp_path):
    """A swap of the root's path after opening changes nothing: every operation starts from the fd."""
    (tmp_path / "other").mkdir()
    root_dir.rename(tmp_path / "moved")
    (tmp_path / "other").rename(root_dir)
    root.write_file("/f", b"x")
    assert (tmp_path / "moved/f").read_bytes() == b"x"
    assert not (root_dir / "f").exists()
