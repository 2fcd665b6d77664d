"""Image directories the hook writes into, replaced by symlinks to the host.

CVE-2024-0132/-0133/-0134 class: /usr/lib/x86_64-linux-gnu, /lib/firmware/nvidia
or /dev pointing at a host directory (absolute link, relative '../..' link,
or a /proc/<pid>/root magic link). Every operation must either fail or land
in the root's own copy of the link target; the host tree never changes.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, mknod)")

LIB = "/usr/lib/x86_64-linux-gnu"
FW = "/lib/firmware/nvidia"


def _lib_ops(s):
    return [
        lambda r: r.bind_mount(str(s.driver / "libcuda.so.1"), f"{LIB}/libcuda.so.1"),
        lambda r: r.symlink("libcuda.so.1", f"{LIB}/libcuda.so"),
        lambda r: r.write_file(f"{LIB}/nvct.txt", b"x"),
        lambda r: r.write_file(f"{LIB}/libhost.so.1.0", b"x", replace=True),
        lambda r: r.makedirs(f"{LIB}/vdpau"),
        lambda r: r.chmod(f"{LIB}/libhost.so.1.0", 0o777),
        lambda r: r.mknod(f"{LIB}/nvidia0", "c", 195, 0),
        lambda r: r.mount_tmpfs(f"{LIB}/tmp"),
        lambda r: r.mount_data(f"{LIB}/params", b"x"),
    ]


def _firmware_ops(s):
    return [
        lambda r: r.makedirs(f"{FW}/535.0"),
        lambda r: r.bind_mount(str(s.driver / "gsp.bin"), f"{FW}/535.0/gsp.bin"),
        lambda r: r.bind_mount(str(s.driver / "gsp.bin"), f"{FW}/gsp.bin"),
        lambda r: r.chmod(f"{FW}/gsp.bin", 0o666),
    ]


def _dev_ops(s):
    return [
        lambda r: r.mknod("/dev/nvidia0", "c", 195, 0, 0o666),
        lambda r: r.mknod("/dev/nvidia-caps/nvidia-cap1", "c", 236, 1),
        lambda r: r.chmod("/dev/nvidia0", 0o777),
        lambda r: r.chown("/dev/nvidia0", 1000, 1000),
        lambda r: r.symlink("/proc/self/fd", "/dev/fd"),
        lambda r: r.bind_mount(str(s.driver / "libcuda.so.1"), "/dev/nvidiactl"),
        lambda r: r.mount_tmpfs("/dev/shm"),
    ]


CASES = {
    "libdir": (LIB, "lib", _lib_ops),
    "firmware": (FW, "firmware", _firmware_ops),
    "dev": ("/dev", "dev", _dev_ops),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_link_to_a_host_dir_fails_and_touches_nothing(scene, resolver, case, kind):
    at, host_sub, ops = CASES[case]
    scene.link(at, kind, scene.host / host_sub)
    errors, new_mounts = scene.attempt(ops(scene), resolver=resolver)
    # inside the root the link dangles: nothing can be done through it
    assert all(errors), errors
    assert new_mounts == []
    scene.assert_host_untouched()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_link_resolves_to_the_roots_own_copy(scene, resolver, case, kind):
    at, host_sub, ops = CASES[case]
    inside = scene.link(at, kind, scene.host / host_sub)
    own = scene.root / inside.lstrip("/")
    own.mkdir(parents=True)
    errors, new_mounts = scene.attempt(ops(scene), resolver=resolver)
    # mounts happened, all inside the root's copy of the target
    assert new_mounts
    assert all(m.mount_point.startswith(str(own) + "/") for m in new_mounts)
    assert os.listdir(own)
    # all succeeded, except chmod of the read-only firmware bind mount
    assert [e for e in errors if e and "Read-only file system" not in e] == []
    scene.assert_host_untouched()


@pytest.mark.parametrize("case", sorted(CASES))
def test_magic_link_through_proc_is_refused(scene, resolver, case):
    at, host_sub, ops = CASES[case]
    scene.link(at, "magic", scene.host / host_sub)
    errors, new_mounts = scene.attempt(ops(scene), proc=True, resolver=resolver)
    assert all(errors), errors
    assert all("symbolic links" in e or "No such file" in e or "procfs" in e
               for e in errors), errors
    assert new_mounts == []
    scene.assert_host_untouched()


def test_magic_link_really_leads_to_the_host(scene):
    """Shows the magic-link attack is real: plain path lookup reaches the host."""
    scene.link(LIB, "magic", scene.host / "lib")

    def naive(r):
        with open(f"{scene.root}{LIB}/libhost.so.1.0", "rb") as f:
            assert f.read() == b"\x7fELF not really"

    errors, _ = scene.attempt([naive], proc=True)
    assert errors == [None]
