"""Creating files, directories, links and nodes in the root (nvct.rootfs.files), with both resolvers."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from nvct.base.errors import ContainerError
from nvct.rootfs import files as files_mod
from nvct.rootfs.root import Rootfs
from tests.rootfs.conftest import needs_root


def test_a_failed_replace_leaves_no_temporary(root, root_dir, monkeypatch):
    (root_dir / "f").write_text("old")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files_mod.os, "write", full)
    with pytest.raises(ContainerError, match="No space left"):
        root.write_file("/f", b"new", replace=True)
    monkeypatch.undo()
    assert sorted(p.name for p in root_dir.iterdir()) == ["f"]
    assert (root_dir / "f").read_text() == "old"


def test_sweep_removes_only_this_files_stale_temporaries(root, root_dir):
    stale = [".f.nvct-0123456789ab", ".f.nvct-ffffffffffff"]
    kept = [".f.nvct-short", ".g.nvct-0123456789ab", ".f.nvct-0123456789abc", "f.nvct-0123456789ab"]
    for name in stale + kept:
        (root_dir / name).write_text("")
    (root_dir / ".f.nvct-aaaaaaaaaaaa").mkdir()  # never removed: not what a write leaves
    root.write_file("/f", b"x", replace=True, sweep=True)
    assert sorted(p.name for p in root_dir.iterdir()) == sorted(["f", ".f.nvct-aaaaaaaaaaaa", *kept])
    root.write_file("/g", b"x", replace=True)  # without sweep: nothing else goes
    assert (root_dir / ".g.nvct-0123456789ab").exists()


def test_makedirs_creates_missing_components_with_exact_mode(root, root_dir):
    old = os.umask(0o077)
    try:
        root.makedirs("/usr/lib/firmware/nvidia", 0o755)
    finally:
        os.umask(old)
    for sub in ("usr", "usr/lib", "usr/lib/firmware", "usr/lib/firmware/nvidia"):
        assert stat.S_IMODE((root_dir / sub).stat().st_mode) == 0o755
    root.makedirs("/usr/lib/firmware/nvidia")  # existing: fine


def test_makedirs_follows_symlinks_inside_root(root, root_dir):
    (root_dir / "usr" / "lib").mkdir(parents=True)
    (root_dir / "lib").symlink_to("usr/lib")
    root.makedirs("/lib/firmware/nvidia")
    assert (root_dir / "usr/lib/firmware/nvidia").is_dir()


def test_makedirs_over_a_file_is_an_error(root, root_dir):
    (root_dir / "etc").write_text("not a dir")
    with pytest.raises(ContainerError, match="/etc in container root .*not a directory"):
        root.makedirs("/etc/ld.so.conf.d")
    with pytest.raises(ContainerError, match="/etc in container root .*not a directory"):
        root.makedirs("/etc")


def test_makedirs_through_dangling_symlink_is_an_error(root, root_dir):
    (root_dir / "lib").symlink_to("/nowhere")
    with pytest.raises(ContainerError, match="dangling symlink"):
        root.makedirs("/lib/firmware")
    assert not (root_dir / "nowhere").exists()


def test_write_file_creates_with_mode_and_parents(root, root_dir):
    root.write_file("/etc/ld.so.conf.d/x.conf", "/opt\n", 0o640)
    path = root_dir / "etc/ld.so.conf.d/x.conf"
    assert path.read_text() == "/opt\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_write_file_refuses_an_existing_file(root, root_dir):
    (root_dir / "f").write_text("old")
    with pytest.raises(ContainerError, match="/f in container root .*already exists"):
        root.write_file("/f", b"new")
    assert (root_dir / "f").read_text() == "old"


def test_write_file_replace_swaps_in_a_new_file(root, root_dir):
    (root_dir / "f").write_text("old")
    root.write_file("/f", b"new", replace=True)
    assert (root_dir / "f").read_text() == "new"
    assert [p.name for p in root_dir.iterdir()] == ["f"]  # no temporary left


def test_write_file_replace_never_replaces_a_directory(root, root_dir):
    (root_dir / "d").mkdir()
    with pytest.raises(ContainerError, match="/d in container root .*Is a directory"):
        root.write_file("/d", b"x", replace=True)
    assert (root_dir / "d").is_dir()
    assert [p.name for p in root_dir.iterdir()] == ["d"]


def test_symlink_stores_target_text_as_given(root, root_dir):
    root.symlink("libcuda.so.1", "/usr/lib/libcuda.so")
    root.symlink("/abs/target", "/usr/lib/abs")
    assert os.readlink(root_dir / "usr/lib/libcuda.so") == "libcuda.so.1"
    assert os.readlink(root_dir / "usr/lib/abs") == "/abs/target"


def test_symlink_identical_existing_link_is_fine(root, root_dir):
    (root_dir / "l").symlink_to("t")
    root.symlink("t", "/l")
    assert os.readlink(root_dir / "l") == "t"


def test_symlink_different_existing_entry_is_an_error(root, root_dir):
    (root_dir / "l").symlink_to("other")
    (root_dir / "f").write_text("x")
    with pytest.raises(ContainerError, match="a symlink to other"):
        root.symlink("t", "/l")
    with pytest.raises(ContainerError, match="not a symlink"):
        root.symlink("t", "/f")


def test_symlink_replace(root, root_dir):
    (root_dir / "l").symlink_to("other")
    (root_dir / "f").write_text("x")
    root.symlink("t", "/l", replace=True)
    root.symlink("t", "/f", replace=True)
    assert os.readlink(root_dir / "l") == "t"
    assert os.readlink(root_dir / "f") == "t"


def test_symlinks_makes_every_link_of_every_folder(root, root_dir):
    (root_dir / "lib").symlink_to("usr/lib")  # one folder reached through an image link
    (root_dir / "usr/lib").mkdir(parents=True)
    (root_dir / "usr/lib/libx.so.1").symlink_to("stale")
    root.symlinks([("libx.so.1.0", "/lib/libx.so.1"), ("libx.so.1", "/lib/libx.so"),
                   ("../libx.so.1", "/usr/lib/gbm/x.so"), ("libx.so.1", "/lib/libx.so")], replace=True)
    assert os.readlink(root_dir / "usr/lib/libx.so.1") == "libx.so.1.0"
    assert os.readlink(root_dir / "usr/lib/libx.so") == "libx.so.1"
    assert os.readlink(root_dir / "usr/lib/gbm/x.so") == "../libx.so.1"
    with pytest.raises(ContainerError, match="already exists"):
        root.symlinks([("a", "/usr/lib/new"), ("b", "/usr/lib/libx.so")])
    assert os.readlink(root_dir / "usr/lib/new") == "a"  # in order, up to the one refused


def test_chmod_and_chown(root, root_dir):
    (root_dir / "f").write_text("x")
    (root_dir / "l").symlink_to("/f")
    root.chmod("/l", 0o600)
    assert stat.S_IMODE((root_dir / "f").stat().st_mode) == 0o600
    if os.geteuid() == 0:
        root.chown("/f", 123, 456)
        st = (root_dir / "f").stat()
        assert (st.st_uid, st.st_gid) == (123, 456)
        root.chown("/f", gid=789)
        assert (root_dir / "f").stat().st_gid == 789


@needs_root
def test_mknod_creates_a_char_device(root, root_dir):
    root.mknod("/dev/nvidia0", "c", 195, 0, 0o666, uid=0, gid=44)
    st = (root_dir / "dev/nvidia0").lstat()
    assert stat.S_ISCHR(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, 0)
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert st.st_gid == 44


@needs_root
def test_mknod_is_idempotent_and_resets_mode(root, root_dir):
    root.mknod("/dev/nvidia0", "c", 195, 0, 0o600)
    root.mknod("/dev/nvidia0", "c", 195, 0, 0o666)
    assert stat.S_IMODE((root_dir / "dev/nvidia0").lstat().st_mode) == 0o666


@needs_root
def test_mknod_never_replaces_something_else(root, root_dir):
    (root_dir / "dev").mkdir()
    (root_dir / "dev/nvidia0").write_text("x")
    (root_dir / "dev/nvidia1").symlink_to("/dev/null")
    os.mknod(root_dir / "dev/nvidia2", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    for name in ("nvidia0", "nvidia1", "nvidia2"):
        with pytest.raises(ContainerError, match="refusing to replace it"):
            root.mknod(f"/dev/{name}", "c", 195, 0)
    assert (root_dir / "dev/nvidia0").read_text() == "x"
    assert os.readlink(root_dir / "dev/nvidia1") == "/dev/null"


def test_mknod_rejects_unknown_type(root):
    with pytest.raises(ContainerError, match="type 'p' is not"):
        root.mknod("/dev/x", "p", 1, 1)


@needs_root
def test_concurrent_makedirs_of_one_directory(root, root_dir):
    """Another start creating the directory between our look and our mkdir is fine."""
    import threading

    errors = []

    def make(i):
        try:
            with Rootfs(root_dir) as r:
                r.makedirs(f"/etc/ld.so.conf.d/sub{i % 2}")
        except ContainerError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=make, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_symlink_replace_never_follows_the_link_it_replaces(root, root_dir, tmp_path):
    """create-symlinks replaces an image's link (ln -sf): one aimed at a host file is replaced, not followed."""
    outside = tmp_path / "host-file"
    outside.write_text("host")
    (root_dir / "libcuda.so.1").symlink_to(outside)
    (root_dir / "libcuda.so").symlink_to("../../../../" + str(outside))
    root.symlink("libcuda.so.550", "/libcuda.so.1", replace=True)
    root.symlink("libcuda.so.1", "/libcuda.so", replace=True)
    assert os.readlink(root_dir / "libcuda.so.1") == "libcuda.so.550"
    assert os.readlink(root_dir / "libcuda.so") == "libcuda.so.1"
    assert outside.read_text() == "host" and not outside.is_symlink()
