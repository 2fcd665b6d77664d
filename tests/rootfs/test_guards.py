"""The checks every write passes (nvct.rootfs.guards): no pseudo filesystem, no symlink onto another mount."""

from __future__ import annotations

import os

from nvct.base.errors import ContainerError
from nvct.linux import fs
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.rootfs.root import Rootfs
from tests.rootfs.conftest import needs_root


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
