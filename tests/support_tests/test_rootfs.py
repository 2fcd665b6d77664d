from __future__ import annotations

import os

import pytest

from tests.support.fixtures import need_rootfs_tools
from tests.support.rootfs import PROBE, base_rootfs, build_base_rootfs, make_rootfs, run_in_rootfs


def _ldconfig_print(root: str) -> str:
    # The rootfs's own static ldconfig reads the cache the build wrote.
    return run_in_rootfs(root, "/sbin/ldconfig", "-p").stdout


def test_base_rootfs_has_busybox_loader_libc_ldconfig_and_conf(rootfs):
    assert os.readlink(os.path.join(rootfs, "bin/sh")) == "busybox"
    for applet in ("ls", "cat", "stat", "find", "readlink", "grep", "env", "mount", "sleep"):
        assert os.path.islink(os.path.join(rootfs, "bin", applet)), applet
    assert os.readlink(os.path.join(rootfs, "lib64/ld-linux-x86-64.so.2")) == \
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    assert os.path.isfile(os.path.join(rootfs, "lib/x86_64-linux-gnu/libc.so.6"))
    with open(os.path.join(rootfs, "etc/ld.so.conf")) as f:
        assert f.read().startswith("include /etc/ld.so.conf.d/*.conf")
    with open(os.path.join(rootfs, "etc/ld.so.conf.d/x86_64-linux-gnu.conf")) as f:
        assert "/usr/lib/x86_64-linux-gnu\n" in f.read()
    for d in ("proc", "dev", "sys", "tmp", "run"):
        assert os.listdir(os.path.join(rootfs, d)) == []
    assert "libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6" in _ldconfig_print(rootfs)


def test_probe_reports_resolved_path_and_clean_failure(rootfs):
    proc = run_in_rootfs(rootfs, PROBE, "libc.so.6", "libnvct-missing.so.1")
    assert proc.returncode == 1
    ok, fail = proc.stdout.splitlines()
    assert ok == "ok libc.so.6 /lib/x86_64-linux-gnu/libc.so.6"
    assert fail.startswith("fail libnvct-missing.so.1 libnvct-missing.so.1: cannot open")


def test_copies_are_independent_of_the_base(rootfs, tmp_path):
    with open(os.path.join(rootfs, "etc/passwd"), "a") as f:
        f.write("intruder:x:1:1::/:/bin/sh\n")
    with open(os.path.join(base_rootfs(), "etc/passwd")) as f:
        assert "intruder" not in f.read()
    assert os.path.samefile(make_rootfs(tmp_path, name="again"), tmp_path / "again")


def test_merged_usr_layout(tmp_path):
    need_rootfs_tools()
    root = build_base_rootfs(str(tmp_path / "merged"), merged_usr=True)
    assert os.readlink(os.path.join(root, "lib")) == "usr/lib"
    assert os.path.isfile(os.path.join(root, "usr/lib/x86_64-linux-gnu/libc.so.6"))
    proc = run_in_rootfs(root, PROBE, "libc.so.6")
    assert proc.stdout == "ok libc.so.6 /lib/x86_64-linux-gnu/libc.so.6\n"


def test_refuses_an_existing_destination(tmp_path):
    need_rootfs_tools()
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        build_base_rootfs(str(tmp_path / "taken"))
