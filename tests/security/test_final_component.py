"""The very path the hook creates or changes is a symlink to a host file.

chmod, write_file, bind-mount targets, mknod and symlink must never follow a
final-component link out of the root: they fail, or act on the link itself
(replace), or on the root's own copy of the target.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, mknod)")

TARGET = "/etc/target"


def _ops(s):
    return {
        "chmod": lambda r: r.chmod(TARGET, 0o777),
        "chown": lambda r: r.chown(TARGET, 1000, 1000),
        "write_file": lambda r: r.write_file(TARGET, b"pwned"),
        "bind_mount": lambda r: r.bind_mount(str(s.driver / "libcuda.so.1"), TARGET),
        "mknod": lambda r: r.mknod(TARGET, "c", 195, 0),
        "symlink": lambda r: r.symlink("elsewhere", TARGET),
        "makedirs": lambda r: r.makedirs(TARGET),
        "mount_tmpfs": lambda r: r.mount_tmpfs(TARGET),
        "mount_data": lambda r: r.mount_data(TARGET, b"x"),
    }


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_operations_on_a_link_to_a_host_file_fail(scene, resolver, kind):
    scene.link(TARGET, kind, scene.host / "secret")
    ops = _ops(scene)
    errors, new_mounts = scene.attempt(list(ops.values()), resolver=resolver)
    failed = dict(zip(ops, errors))
    assert all(failed.values()), failed
    assert "refusing to replace it" in failed["mknod"]
    assert "a symlink to" in failed["symlink"]
    assert new_mounts == []
    scene.assert_host_untouched()


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_replacing_replaces_the_link_not_the_host_file(scene, resolver, kind):
    scene.link(TARGET, kind, scene.host / "secret")
    scene.link("/etc/other", kind, scene.host / "secret")
    errors, _ = scene.attempt([
        lambda r: r.write_file(TARGET, b"ours", replace=True),
        lambda r: r.symlink("elsewhere", "/etc/other", replace=True),
    ], resolver=resolver)
    assert errors == [None, None]
    assert (scene.root / "etc/target").read_bytes() == b"ours"
    assert not (scene.root / "etc/target").is_symlink()
    assert os.readlink(scene.root / "etc/other") == "elsewhere"
    scene.assert_host_untouched()


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_a_link_with_an_in_root_copy_acts_on_the_copy(scene, resolver, kind):
    inside = scene.link(TARGET, kind, scene.host / "secret")
    copy = scene.root / inside.lstrip("/")
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("root's own file")
    ops = _ops(scene)
    errors, new_mounts = scene.attempt([ops["chmod"], ops["bind_mount"]], resolver=resolver)
    assert errors == [None, None]
    assert [m.mount_point for m in new_mounts] == [str(copy)]
    assert oct(copy.stat().st_mode & 0o777) == oct(0o777)
    scene.assert_host_untouched()


def test_dev_node_path_linked_to_a_host_file(scene, resolver):
    scene.link("/dev/nvidia0", "absolute", scene.host / "secret")
    errors, _ = scene.attempt([lambda r: r.mknod("/dev/nvidia0", "c", 195, 0, 0o666),
                               lambda r: r.chmod("/dev/nvidia0", 0o666)],
                              resolver=resolver)
    assert "refusing to replace it" in errors[0]
    assert "No such file" in errors[1]
    scene.assert_host_untouched()
