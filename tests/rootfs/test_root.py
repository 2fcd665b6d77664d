"""Rootfs: each operation, with both resolvers (openat2 and the manual walk)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from nvct.base.errors import ContainerError
from nvct.linux import fs
from nvct.linux.namespaces import in_private_mount_namespace, mounts
from nvct.rootfs import files as files_mod, mounts as mounts_mod, root as rootfs
from nvct.rootfs.root import Rootfs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, mknod)")


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    """Runs a test once with openat2(2) and once with the fallback walk."""
    if request.param == "walk":
        monkeypatch.setattr(fs, "_have_openat2", False)
    elif not fs.openat2_available():
        pytest.skip("kernel has no openat2(2); the walk variant covers this test")
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


def _mount_at(point: str):
    found = [m for m in mounts() if m.mount_point == point]
    return found[-1] if found else None


# -- resolution ---------------------------------------------------------


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


def test_exists(root, root_dir):
    (root_dir / "file").write_text("x")
    (root_dir / "dangling").symlink_to("/nowhere")
    assert root.exists("/file")
    assert root.exists("/")
    assert not root.exists("/missing")
    assert not root.exists("/file/below")
    assert not root.exists("/dangling")


def test_missing_root_is_a_one_line_error(tmp_path):
    with pytest.raises(ContainerError, match="container root .*missing: No such file"):
        Rootfs(tmp_path / "missing")


def test_nul_in_path_is_rejected(root):
    with pytest.raises(ContainerError, match="invalid container path"):
        root.exists("/a\0b")


# -- the root itself --------------------------------------------------------


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


# -- directories, files, symlinks ------------------------------------------


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


# -- device nodes ---------------------------------------------------------------


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


# -- mounts (each in a child in a private mount namespace) --------------------


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
        return target.read_text(), writable, _mount_at(str(target))

    content, writable, info = in_private_mount_namespace(work)
    assert content == "driver"
    assert not writable
    assert info is not None
    assert src.read_text() == "driver"
    # the session's namespace never saw the mount
    assert _mount_at(str(root_dir / "usr/lib/x86_64-linux-gnu/libcuda.so.1")) is None


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
        info = _mount_at(str(target))
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
        return _mount_at(point), stat.S_IMODE(os.stat(point).st_mode)

    info, mode = in_private_mount_namespace(work)
    assert info.fstype == "tmpfs"
    assert "size=1024k" in info.super_options
    assert mode == 0o700


def _with_proc(root_dir, ops):
    """Mount procfs at the root's /proc (as runc does) and try each op there."""
    (root_dir / "proc").mkdir(exist_ok=True)
    (root_dir / "self").symlink_to("/proc/self")

    def work():
        fs.mount("proc", str(root_dir / "proc"), "proc", 0)
        root = Rootfs(root_dir)
        me = f"/proc/{os.getpid()}"  # no symlink on the way, unlike /proc/self
        results = []
        for op in ops:
            try:
                results.append(("ok", op(root, me)))
            except ContainerError as e:
                results.append(("error", str(e)))
        return results

    return in_private_mount_namespace(work)


@needs_root
def test_nothing_on_procfs_is_created_or_changed(resolver, root_dir):
    results = _with_proc(root_dir, [
        lambda root, me: root.chmod(f"{me}/comm", 0o777),
        lambda root, me: root.chown(f"{me}/comm", 1, 1),
        lambda root, me: root.write_file(f"{me}/nvct", b"x"),
        lambda root, me: root.write_file(f"{me}/comm", b"x", replace=True),
        lambda root, me: root.makedirs(f"{me}/nvct"),
        lambda root, me: root.symlink("x", f"{me}/nvct"),
        lambda root, me: root.mknod(f"{me}/nvct", "c", 1, 3),
        lambda root, me: root.bind_mount("/dev/null", f"{me}/nvct"),  # would create it
        lambda root, me: root.write_file("/self/nvct", b"x"),
    ])
    assert all(kind == "error" for kind, _ in results), results
    refused = [msg for _, msg in results if "on procfs, refusing to touch it" in msg
               or "through a symlink onto another mount" in msg]
    # /self -> /proc/self: the walk refuses every symlink on procfs (ELOOP)
    assert len(refused) == (9 if resolver == "openat2" else 8), results


@needs_root
def test_procfs_is_read_and_mounted_over_only_where_named(resolver, root_dir):
    results = _with_proc(root_dir, [
        lambda root, me: root.read_file(f"{me}/comm"),
        lambda root, me: root.mount_data(f"{me}/comm", "masked\n"),
        lambda root, me: root.read_file(f"{me}/comm"),
        lambda root, me: root.mount_tmpfs(f"{me}/fdinfo"),
        lambda root, me: root.read_file("/self/status"),
        lambda root, me: root.bind_mount("/dev/null", "/self/environ"),
        lambda root, me: root.mount_tmpfs("/self/fd"),
    ])
    assert results[0][0] == "ok" and results[0][1].endswith(b"\n")
    assert results[1:4] == [("ok", None), ("ok", b"masked\n"), ("ok", None)]
    for kind, msg in results[4:]:
        assert kind == "error", results
        assert "procfs reached through a symlink" in msg or "symbolic links" in msg


@needs_root
def test_a_root_opened_in_another_mount_namespace_is_refused(root):
    with pytest.raises(ContainerError, match="opened in another mount namespace"):
        in_private_mount_namespace(root.makedirs, "/x")


# -- mount boundaries ---------------------------------------------------


@needs_root
def test_nothing_is_created_through_a_symlink_onto_another_mount(resolver, root_dir, tmp_path):
    """An image link into a bind mount of a host directory (the MPS dir) is never written through."""
    host = tmp_path / "host-mps"
    host.mkdir()
    (root_dir / "tmp" / "nvidia-mps").mkdir(parents=True)
    (root_dir / "usr" / "lib").mkdir(parents=True)
    os.symlink("/tmp/nvidia-mps", root_dir / "usr" / "lib" / "x86_64-linux-gnu")

    def work():
        fs.mount(str(host), str(root_dir / "tmp" / "nvidia-mps"), None, fs.MS_BIND)
        out = []
        with Rootfs(root_dir) as root:
            for op in (lambda r: r.symlink("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"),
                       lambda r: r.write_file("/usr/lib/x86_64-linux-gnu/x.conf", b"x"),
                       lambda r: r.makedirs("/usr/lib/x86_64-linux-gnu/vdpau"),
                       lambda r: r.bind_mount("/dev/null", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                       lambda r: r.mknod("/usr/lib/x86_64-linux-gnu/nvidia0", "c", 1, 3)):
                try:
                    op(root)
                    out.append("ok")
                except ContainerError as e:
                    out.append(str(e))
            # Named literally, the mount point itself is a fine place to write.
            root.write_file("/tmp/nvidia-mps/named", b"x")
            out.append(sorted(os.listdir(host)))
        return out

    results = in_private_mount_namespace(work)
    assert all("through a symlink onto another mount" in r for r in results[:-1]), results
    assert results[-1] == ["named"]
    os.unlink(host / "named")
    assert os.listdir(host) == []


@needs_root
def test_check_same_mount_for_ldconfig_folders(resolver, root_dir, tmp_path):
    host = tmp_path / "vol"
    host.mkdir()
    (root_dir / "data").mkdir()
    (root_dir / "lib").mkdir()
    os.symlink("/data", root_dir / "libs")

    def work():
        fs.mount(str(host), str(root_dir / "data"), None, fs.MS_BIND)
        with Rootfs(root_dir) as root:
            root.check_same_mount("/lib")
            root.check_same_mount("/data")
            try:
                root.check_same_mount("/libs")
            except ContainerError as e:
                return str(e)
        return "not refused"

    assert "onto another mount (/data)" in in_private_mount_namespace(work)


def test_mount_id_differs_across_mounts(tmp_path):
    fd = os.open("/", os.O_PATH)
    proc = os.open("/proc", os.O_PATH)
    try:
        assert fs.mount_id(fd) != fs.mount_id(proc)
    finally:
        os.close(fd)
        os.close(proc)


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
