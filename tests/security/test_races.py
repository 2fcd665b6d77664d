"""A directory swapped for a host symlink while the hook works (TOCTOU).

CVE-2024-0132 class: a check on a path, then a mount on the same path string,
lets the image swap a component in between. nvct mounts onto
/proc/self/fd/<fd> of the fd it resolved, so a swap after resolution cannot
redirect the mount; the post-mount check notices the tree changed and undoes it.
"""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from nvct.linux import fs
from nvct.rootfs import mounts as rootfs_mounts

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, mknod)")

LIB = "usr/lib/x86_64-linux-gnu"
_libc = ctypes.CDLL(None, use_errno=True)


def _swap_in_host_link(scene):
    """The attacker's move: the library dir becomes a link to the host's."""
    real = scene.root / LIB
    real.rename(real.with_name("x86_64-linux-gnu.old"))
    real.symlink_to(scene.host / "lib")


@pytest.fixture
def libdir(scene):
    (scene.root / LIB).mkdir(parents=True)
    (scene.root / LIB / "libhost.so.1.0").write_bytes(b"image's own")
    return scene


@pytest.mark.parametrize("how", ["bind_mount", "mount_data"])
def test_swap_between_resolution_and_mount_cannot_redirect_it(libdir, resolver, monkeypatch,
                                                              how):
    scene = libdir
    name = "mount" if how == "bind_mount" else "_move_mount"
    real = getattr(rootfs_mounts, name)

    def after_swap(*args):
        _swap_in_host_link(scene)  # the target fd is already resolved: too late
        monkeypatch.setattr(rootfs_mounts, name, real)
        return real(*args)

    monkeypatch.setattr(rootfs_mounts, name, after_swap)
    target = f"/{LIB}/libhost.so.1.0"
    op = {"bind_mount": lambda r: r.bind_mount(str(scene.driver / "libcuda.so.1"), target),
          "mount_data": lambda r: r.mount_data(target, b"x")}[how]
    errors, new_mounts = scene.attempt([op], resolver=resolver)
    assert "changed while mounting; mount undone" in errors[0]
    assert new_mounts == []  # the mount (which landed in the root) was detached
    scene.assert_host_untouched()


def test_without_fds_the_same_swap_mounts_onto_the_host(libdir):
    """Why it matters: a check-then-mount-by-path lands on the host file."""
    scene = libdir
    target = f"{scene.root}/{LIB}/libhost.so.1.0"

    def naive(_):
        assert os.path.realpath(target).startswith(str(scene.root))  # the check
        _swap_in_host_link(scene)
        fs.mount(str(scene.driver / "libcuda.so.1"), target, None, fs.MS_BIND)

    errors, new_mounts = scene.attempt([naive], contained=False)
    assert errors == [None]
    assert [m.mount_point for m in new_mounts] == [str(scene.host / "lib/libhost.so.1.0")]


def _exchange_forever(a: str, b: str) -> None:
    while True:
        _libc.renameat2(-100, a.encode(), -100, b.encode(), 2)  # RENAME_EXCHANGE


def test_concurrent_swapping_never_reaches_the_host(libdir, resolver):
    scene = libdir
    evil = scene.root / "usr/lib/evil"
    evil.symlink_to(scene.host / "lib")
    attacker = os.fork()
    if attacker == 0:
        try:
            _exchange_forever(str(scene.root / LIB), str(evil))
        finally:
            os._exit(0)
    try:
        src = str(scene.driver / "libcuda.so.1")
        ops = []
        for i in range(150):
            ops += [
                lambda r: r.bind_mount(src, f"/{LIB}/libcuda.so.1"),
                lambda r, i=i: r.write_file(f"/{LIB}/f{i}", b"x"),
                lambda r, i=i: r.mknod(f"/{LIB}/nvidia{i}", "c", 195, i),
                lambda r, i=i: r.makedirs(f"/{LIB}/d{i}"),
                lambda r, i=i: r.symlink("libcuda.so.1", f"/{LIB}/l{i}"),
                lambda r: r.chmod(f"/{LIB}/libhost.so.1.0", 0o777),
                lambda r: r.mount_tmpfs(f"/{LIB}/tmp"),
                lambda r, i=i: r.mount_data(f"/{LIB}/data{i}", b"x"),
            ]
        errors, new_mounts = scene.attempt(ops, resolver=resolver)
        assert len(errors) == len(ops)  # every operation came back under the race, none retried forever
    finally:
        os.kill(attacker, signal.SIGKILL)
        os.waitpid(attacker, 0)
    # Some operations win, some lose the race; none escapes. attempt() has
    # already checked every mount point is inside the root.
    assert any(e is None for e in errors)
    scene.assert_host_untouched()
