"""Mounting onto paths of the root (nvct.rootfs.mounts), each mount checked to land where its path leads."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from nvct.base.errors import ContainerError
from nvct.linux import fs
from nvct.linux.namespaces import in_private_mount_namespace, mounts
from nvct.rootfs import mounts as mounts_mod
from nvct.rootfs.root import Rootfs
from tests.rootfs.conftest import mount_at, needs_root


@needs_root
def test_bind_mount_file_read_only(resolver, root_dir, tmp_path):
    src = tmp_path / "libcuda.so.1"
    src.write_text("driver")

    def work():
        with Rootfs(root_dir) as root:
            root.bind_mount(str(src), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        target = root_dir / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
        try:
            target.write_text("changed")
            writable = True
        except OSError:
            writable = False
        return target.read_text(), writable, mount_at(str(target))

    content, writable, info = in_private_mount_namespace(work)
    assert content == "driver"
    assert not writable
    assert info is not None
    assert src.read_text() == "driver"
    # the session's namespace never saw the mount
    assert mount_at(str(root_dir / "usr/lib/x86_64-linux-gnu/libcuda.so.1")) is None


@needs_root
def test_bind_mount_directory_with_flags(resolver, root_dir, tmp_path):
    src = tmp_path / "firmware"
    src.mkdir()
    (src / "gsp.bin").write_text("fw")

    def work():
        with Rootfs(root_dir) as root:
            root.bind_mount(str(src), "/lib/firmware/nvidia/1.0", readonly=False, noexec=True)
        point = str(root_dir / "lib/firmware/nvidia/1.0")
        options = open("/proc/self/mountinfo").read()
        return os.listdir(point), [line for line in options.splitlines()
                                   if f" {point} " in line]

    names, lines = in_private_mount_namespace(work)
    assert names == ["gsp.bin"]
    assert len(lines) == 1
    per_mount = lines[0].split()[5].split(",")
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(per_mount)


@needs_root
def test_bind_mount_kind_mismatch_is_an_error(root, root_dir, tmp_path):
    src = tmp_path / "lib.so"
    src.write_text("x")
    (root_dir / "usr/lib/lib.so").mkdir(parents=True)
    with pytest.raises(ContainerError, match="source .*: not a directory"):
        root.bind_mount(str(src), "/usr/lib/other", is_dir=True)
    with pytest.raises(ContainerError, match="mount target is a directory"):
        in_private_mount_namespace(lambda: Rootfs(root_dir).bind_mount(str(src),
                                                                       "/usr/lib/lib.so"))


def test_bind_mount_missing_source_is_an_error(root, tmp_path):
    with pytest.raises(ContainerError, match="bind mount source .*missing: No such file"):
        root.bind_mount(str(tmp_path / "missing"), "/x")


@needs_root
def test_a_failed_remount_undoes_the_mount(resolver, root_dir, tmp_path, monkeypatch):
    src = tmp_path / "lib.so"
    src.write_text("x")
    real_mount = mounts_mod.mount

    def refuse_remount(source, target, fstype, flags, data=None):
        if flags & fs.MS_REMOUNT:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM), target)
        return real_mount(source, target, fstype, flags, data)

    monkeypatch.setattr(mounts_mod, "mount", refuse_remount)

    def work():
        before = set(mounts())
        try:
            Rootfs(root_dir).bind_mount(str(src), "/usr/lib/lib.so")
            error = None
        except ContainerError as e:
            error = str(e)
        return error, [m for m in mounts() if m not in before]

    error, new_mounts = in_private_mount_namespace(work)
    assert error.endswith("/usr/lib/lib.so in container root "
                          f"{root_dir}: Operation not permitted")
    assert new_mounts == []


@needs_root
def test_mount_data_shows_content_read_only(resolver, root_dir):
    (root_dir / "etc").mkdir()
    (root_dir / "etc/params").write_text("ModifyDeviceFiles: 1\n")

    def work():
        with Rootfs(root_dir) as root:
            root.mount_data("/etc/params", "ModifyDeviceFiles: 0\n", 0o444)
            root.mount_data("/new/file", b"created")
        target = root_dir / "etc/params"
        try:
            target.write_text("x")
            writable = True
        except OSError:
            writable = False
        info = mount_at(str(target))
        return (target.read_text(), (root_dir / "new/file").read_text(), writable,
                stat.S_IMODE(target.stat().st_mode), info.fstype, info.super_options)

    content, created, writable, mode, fstype, options = in_private_mount_namespace(work)
    assert (content, created, writable, mode) == ("ModifyDeviceFiles: 0\n", "created", False,
                                                  0o444)
    assert fstype == "tmpfs"
    assert (root_dir / "etc/params").read_text() == "ModifyDeviceFiles: 1\n"


@needs_root
def test_mount_data_onto_a_directory_is_an_error(resolver, root_dir):
    (root_dir / "etc").mkdir()
    with pytest.raises(ContainerError, match="mount target is a directory"):
        in_private_mount_namespace(lambda: Rootfs(root_dir).mount_data("/etc", b"x"))


@needs_root
def test_mount_tmpfs(resolver, root_dir):
    def work():
        with Rootfs(root_dir) as root:
            root.mount_tmpfs("/run/nvidia", "size=1m,mode=0700")
        point = str(root_dir / "run/nvidia")
        return mount_at(point), stat.S_IMODE(os.stat(point).st_mode)

    info, mode = in_private_mount_namespace(work)
    assert info.fstype == "tmpfs"
    assert "size=1024k" in info.super_options
    assert mode == 0o700


@needs_root
def test_bind_mount_recursive_and_private(resolver, root_dir, tmp_path):
    """``rbind`` carries the source's submounts along; ``rprivate`` leaves no propagation tag."""
    src = tmp_path / "mps"
    (src / "sub").mkdir(parents=True)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pipe").write_text("x")

    def work():
        fs.mount(str(src), str(src), None, fs.MS_BIND)
        fs.mount(None, str(src), None, 0x100000)  # MS_SHARED: a bind would join its peers
        fs.mount(str(inner), str(src / "sub"), None, fs.MS_BIND)
        out = []
        for name, recursive in (("flat", False), ("deep", True)):
            with Rootfs(root_dir) as root:
                root.bind_mount(str(src), f"/{name}", readonly=False, recursive=recursive, private=True)
            point = str(root_dir / name)
            line, = [m for m in open("/proc/self/mountinfo").read().splitlines() if f" {point} " in m]
            out.append((os.listdir(f"{point}/sub"), line.split()[6]))
        return out

    assert in_private_mount_namespace(work) == [([], "-"), (["pipe"], "-")]


@needs_root
def test_remount_read_only_keeps_nosuid_and_nodev_of_the_roots_own_mount(root_dir):
    def work():
        fs.mount(str(root_dir), str(root_dir), None, fs.MS_BIND)
        fs.mount(None, str(root_dir), None, fs.MS_BIND | fs.MS_REMOUNT | fs.MS_NOSUID | fs.MS_NODEV)
        with Rootfs(root_dir) as root:
            root.remount_read_only()
        flags = os.statvfs(root_dir).f_flag
        return bool(flags & os.ST_RDONLY), bool(flags & os.ST_NOSUID), bool(flags & os.ST_NODEV)

    assert in_private_mount_namespace(work) == (True, True, True)
    assert not os.statvfs(root_dir).f_flag & os.ST_RDONLY  # only in that namespace


@needs_root
def test_remount_read_only_of_a_root_that_is_no_mount_fails_with_one_line(root_dir):
    def work():
        try:
            with Rootfs(root_dir) as root:
                root.remount_read_only()
        except ContainerError as e:
            return str(e)
        return None

    error = in_private_mount_namespace(work)
    assert error == f"container root {root_dir}: cannot make it read-only: Invalid argument"
    assert not os.statvfs(root_dir).f_flag & os.ST_RDONLY
