"""Updating a container's ld cache with the host's static ldconfig, confined."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest

from nvct.base.errors import ContainerError
from nvct.linux.fs import MS_BIND, MS_RDONLY, MS_REMOUNT, mount
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.rootfs import files as files_mod, sandbox
from nvct.rootfs.ldconfig import (
    CONF_PATH,
    ReadOnlyRootfsError,
    host_ldconfig_path,
    open_static_executable,
    update_ldcache,
)
from tests.support.fixtures import skip

HOST_LDCONFIG = "/sbin/ldconfig"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, namespaces)")
needs_ldconfig = pytest.mark.skipif(not os.path.exists(HOST_LDCONFIG),
                                    reason=f"needs {HOST_LDCONFIG}")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

PROBE_C = r"""
#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    int fds = 0;
    struct dirent *de;
    DIR *dir;
    for (char **e = environ; *e; e++) printf("env %s\n", *e);
    for (int i = 0; i < argc; i++) printf("arg %s\n", argv[i]);
    printf("uid %d\n", (int)getuid());
    printf("nnp %d\n", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0));
    syscall(SYS_capget, &h, d);
    printf("cap %llx\n", ((unsigned long long)d[1].effective << 32) | d[0].effective);
    for (int fd = 0; fd < 4096; fd++) if (fcntl(fd, F_GETFD) != -1) fds++;
    printf("fds %d\n", fds);
    dir = opendir("/");
    while ((de = readdir(dir))) if (de->d_name[0] != '.') printf("root %s\n", de->d_name);
    printf("stdin %zd\n", read(0, &h, 1));
    return 0;
}
"""


def _cc(out, source, *flags):
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", *flags, "-o", str(out), str(src)], check=True)
    return out


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Binaries for the tests: a library, a probe and a sleeper (static), a dynamic one."""
    if shutil.which("gcc") is None:
        skip("needs gcc")
    d = tmp_path_factory.mktemp("built")
    return {
        "lib": _cc(d / "libnvctfoo.so.1.0", "int nvctfoo(void) { return 42; }\n",
                   "-shared", "-fPIC", "-Wl,-soname,libnvctfoo.so.1"),
        "probe": _cc(d / "probe", PROBE_C, "-static"),
        "sleeper": _cc(d / "sleeper", "#include <unistd.h>\nint main(void)"
                       "{ sleep(30); return 0; }\n", "-static"),
        "dynamic": _cc(d / "dynamic", "int main(void) { return 0; }\n"),
    }


@pytest.fixture
def image(tmp_path, built):
    """A container root with a library in a directory the loader does not search."""
    root = tmp_path / "root"
    (root / "opt/nv/lib").mkdir(parents=True)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    shutil.copy(built["lib"], root / "opt/nv/lib")
    return root


def _cache_listing(root) -> str:
    return subprocess.run([HOST_LDCONFIG, "-p", "-C", str(root / "etc/ld.so.cache")],
                          capture_output=True, text=True, check=True).stdout


# -- configuration and the binary --------------------------------------------------


@pytest.mark.parametrize("present, value, path", [
    ((), "@/x/ldconfig", "/x/ldconfig"),  # neither there: the configured name, for the error
    ((), "/x/ldconfig.real", "/x/ldconfig.real"),
    (("ldconfig",), "@/x/ldconfig", "/x/ldconfig"),  # Debian, Fedora
    (("ldconfig",), "@/x/ldconfig.real", "/x/ldconfig"),  # an Ubuntu config on them
    (("ldconfig", "ldconfig.real"), "@/x/ldconfig", "/x/ldconfig.real"),  # Ubuntu: the wrapper's binary
    (("ldconfig", "ldconfig.real"), "/x/ldconfig.real", "/x/ldconfig.real"),
])
def test_host_ldconfig_path_prefers_the_real_binary_beside_a_wrapper(tmp_path, present, value, path):
    for name in present:
        (tmp_path / name).touch()
    at = str(tmp_path)
    assert host_ldconfig_path(value.replace("/x", at)) == path.replace("/x", at)


@pytest.mark.parametrize("value", ["ldconfig", "@ldconfig", "@", ""])
def test_relative_ldconfig_is_refused(value):
    with pytest.raises(ContainerError, match="must be an absolute host path"):
        host_ldconfig_path(value)


@needs_ldconfig
def test_debian_static_pie_ldconfig_is_accepted():
    os.close(open_static_executable(HOST_LDCONFIG))


@needs_gcc
def test_dynamic_executable_is_refused(built):
    with pytest.raises(ContainerError, match="dynamic: dynamically linked; a static ldconfig"):
        open_static_executable(str(built["dynamic"]))


def test_script_and_junk_are_refused(tmp_path):
    script = tmp_path / "ldconfig"
    script.write_text("#!/bin/sh\nexec /sbin/ldconfig.real \"$@\"\n")
    with pytest.raises(ContainerError, match="not an ELF executable.*ldconfig.real"):
        open_static_executable(str(script))
    truncated = tmp_path / "truncated"
    truncated.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 60)
    with pytest.raises(ContainerError, match="truncated: not an ELF executable"):
        open_static_executable(str(truncated))
    with pytest.raises(ContainerError, match="missing: No such file"):
        open_static_executable(str(tmp_path / "missing"))


def test_relative_folder_is_refused(tmp_path):
    with pytest.raises(ContainerError, match="library folder 'opt/lib': must be an absolute"):
        update_ldcache(str(tmp_path), ["opt/lib"])


# -- updating the cache ------------------------------------------------------------


@needs_root
@needs_ldconfig
def test_library_in_a_listed_folder_gets_into_the_cache(image):
    update_ldcache(str(image), ["/opt/nv/lib"])
    assert "libnvctfoo.so.1 (libc6,x86-64) => /opt/nv/lib/libnvctfoo.so.1" in \
        _cache_listing(image)
    assert os.readlink(image / "opt/nv/lib/libnvctfoo.so.1") == "libnvctfoo.so.1.0"
    assert (image / CONF_PATH.lstrip("/")).read_text().splitlines()[1:] == ["/opt/nv/lib"]


@needs_root
@needs_ldconfig
def test_bare_image_without_etc_or_ld_so_conf(image):
    shutil.rmtree(image / "etc")
    update_ldcache(str(image), ["//opt/./nv/lib/"])
    assert "=> /opt/nv/lib/libnvctfoo.so.1" in _cache_listing(image)
    assert (image / CONF_PATH.lstrip("/")).read_text().splitlines()[1:] == ["/opt/nv/lib"]


@needs_root
@needs_ldconfig
def test_running_again_replaces_the_conf_file(image):
    update_ldcache(str(image), ["/opt/nv/lib", "/opt/other"])
    update_ldcache(str(image), ["/opt/nv/lib"])
    assert (image / CONF_PATH.lstrip("/")).read_text().splitlines()[1:] == ["/opt/nv/lib"]
    assert os.listdir(image / "etc/ld.so.conf.d") == [os.path.basename(CONF_PATH)]


@needs_root
@needs_ldconfig
def test_no_folders_only_rebuilds_the_cache(image):
    (image / "usr/lib").mkdir(parents=True)
    shutil.copy(image / "opt/nv/lib/libnvctfoo.so.1.0", image / "usr/lib")
    update_ldcache(str(image), [])
    assert "=> /usr/lib/libnvctfoo.so.1" in _cache_listing(image)
    assert not (image / CONF_PATH.lstrip("/")).exists()


@needs_root
@needs_ldconfig
def test_read_only_etc_is_reported(image):
    def work():
        etc = str(image / "etc")
        mount(etc, etc, None, MS_BIND)
        mount(None, etc, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        update_ldcache(str(image), ["/opt/nv/lib"])

    with pytest.raises(ReadOnlyRootfsError, match="/etc in container root .* is read-only"):
        in_private_mount_namespace(work)
    assert not (image / "etc/ld.so.cache").exists()


@needs_root
@needs_ldconfig
def test_ldconfig_failure_reports_its_last_line(image):
    (image / "etc/ld.so.cache").mkdir()
    with pytest.raises(ContainerError, match=r"failed in container root .*\(exit status 1\): "
                                             r".*ld\.so\.cache"):
        update_ldcache(str(image), ["/opt/nv/lib"])


@needs_root
def test_ldconfig_runs_confined(image, built, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/evil.so")
    out = update_ldcache(str(image), ["/opt/nv/lib"], ldconfig=f"@{built['probe']}")
    lines = out.splitlines()
    assert [x for x in lines if x.startswith("env ")] == ["env PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    assert [x for x in lines if x.startswith("arg ")] == [
        "arg ldconfig", "arg -C", "arg /etc/ld.so.cache", "arg /opt/nv/lib"]
    assert "uid 0" in lines and "nnp 1" in lines
    # only CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
    assert "cap e" in lines
    assert "fds 3" in lines  # stdin, stdout, stderr; nothing of ours leaks
    assert "stdin 0" in lines  # /dev/null, never the container's stdin
    assert sorted(x[5:] for x in lines if x.startswith("root ")) == ["etc", "opt"]


@needs_root
def test_a_hanging_ldconfig_is_killed(image, built):
    with pytest.raises(ContainerError, match="killed after 0.5s"):  # within seconds: tests/perf/test_rootfs.py
        update_ldcache(str(image), [], ldconfig=f"@{built['sleeper']}", timeout=0.5)


@needs_root
def test_setup_failure_in_the_child_is_reported(image, built, monkeypatch):
    monkeypatch.setattr(sandbox, "_KEEP_CAPS", {"no_such_cap"})
    with pytest.raises(ContainerError, match="ldconfig in container root .*: unknown capab"):
        update_ldcache(str(image), [], ldconfig=f"@{built['probe']}")


# -- the image's cache patched instead of running ldconfig ---------------------------

LIBDIR = "/usr/lib/x86_64-linux-gnu"
INJECTED = [f"{LIBDIR}/libnvctfoo.so.1", f"{LIBDIR}/libnvctfoo.so"]


@pytest.fixture
def driver_image(tmp_path, built):
    """An image with its own ld cache (a stub ``libnvctfoo.so.1`` in /opt/stub, listed in
    ld.so.conf), then the driver's library injected as the hook chain leaves it."""
    root = tmp_path / "root"
    for d in ("opt/stub", "etc/ld.so.conf.d", LIBDIR.lstrip("/"), "usr/lib/glibc-hwcaps/x86-64-v2"):
        (root / d).mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("/opt/stub\ninclude /etc/ld.so.conf.d/*.conf\n")
    shutil.copy(built["lib"], root / "opt/stub/libnvctfoo.so.1")
    shutil.copy(built["lib"], root / "usr/lib/glibc-hwcaps/x86-64-v2/libnvctfoo.so.1")  # a hwcaps extension
    subprocess.run([HOST_LDCONFIG, "-r", str(root)], check=True)
    shutil.copy(built["lib"], root / LIBDIR.lstrip("/"))
    os.symlink("libnvctfoo.so.1.0", root / LIBDIR.lstrip("/") / "libnvctfoo.so.1")
    os.symlink("libnvctfoo.so.1", root / LIBDIR.lstrip("/") / "libnvctfoo.so")
    return root


def _ldconfig_runs(monkeypatch) -> list:
    runs = []
    real = sandbox.run
    monkeypatch.setattr(sandbox, "run", lambda *a, **k: runs.append(a) or real(*a, **k))
    return runs


@needs_root
@needs_ldconfig
def test_patched_cache_is_the_one_ldconfig_writes(driver_image, monkeypatch):
    cache = driver_image / "etc/ld.so.cache"
    image_cache = cache.read_bytes()
    update_ldcache(str(driver_image), [LIBDIR])
    by_ldconfig = _cache_listing(driver_image)
    cache.write_bytes(image_cache)
    runs = _ldconfig_runs(monkeypatch)
    update_ldcache(str(driver_image), [LIBDIR], libraries=INJECTED)
    assert runs == []
    assert _cache_listing(driver_image) == by_ldconfig  # order, flags, hwcaps and generator included
    listing = by_ldconfig.splitlines()
    ours = listing.index(f"\tlibnvctfoo.so.1 (libc6,x86-64) => {LIBDIR}/libnvctfoo.so.1")
    assert ours < listing.index("\tlibnvctfoo.so.1 (libc6,x86-64) => /opt/stub/libnvctfoo.so.1")
    assert 'hwcap: "x86-64-v2"' in by_ldconfig
    assert (driver_image / CONF_PATH.lstrip("/")).read_text().splitlines()[1:] == [LIBDIR]


@needs_root
@needs_ldconfig
def test_an_i386_library_is_patched_in_as_ldconfig_enters_it(driver_image, sim_node, monkeypatch):
    """compat32: the simulated driver's 32-bit libcuda (it needs libc.so.6: ldconfig's libc6 flag)."""
    lib32 = "/usr/lib/i386-linux-gnu"
    version = sim_node["driver_version"]
    (driver_image / lib32.lstrip("/")).mkdir(parents=True)
    shutil.copy(os.path.join(sim_node["roots"]["driver_root"], lib32.lstrip("/"), f"libcuda.so.{version}"),
                driver_image / lib32.lstrip("/"))
    os.symlink(f"libcuda.so.{version}", driver_image / lib32.lstrip("/") / "libcuda.so.1")
    cache = driver_image / "etc/ld.so.cache"
    image_cache = cache.read_bytes()
    update_ldcache(str(driver_image), [LIBDIR, lib32])
    by_ldconfig = _cache_listing(driver_image)
    cache.write_bytes(image_cache)
    runs = _ldconfig_runs(monkeypatch)
    update_ldcache(str(driver_image), [LIBDIR, lib32], libraries=[*INJECTED, f"{lib32}/libcuda.so.1"])
    assert runs == []
    assert _cache_listing(driver_image) == by_ldconfig
    assert f"libcuda.so.1 (libc6) => {lib32}/libcuda.so.1" in by_ldconfig


@needs_root
@needs_ldconfig
def test_a_killed_writes_temporaries_are_swept_and_a_failed_one_leaves_none(driver_image, monkeypatch):
    """The cache's and the conf file's temporaries never survive (written under the /etc lock)."""
    stale = [driver_image / "etc/.ld.so.cache.nvct-0123456789ab",
             driver_image / "etc/ld.so.conf.d/.00-nvct-driver.conf.nvct-ba9876543210"]
    for path in stale:
        path.write_bytes(b"left by a killed start")
    image_cache = (driver_image / "etc/ld.so.cache").read_bytes()
    update_ldcache(str(driver_image), [LIBDIR], libraries=INJECTED)
    assert not any(p.exists() for p in stale)
    (driver_image / "etc/ld.so.cache").write_bytes(image_cache)  # the patch is written again

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files_mod.os, "write", full)
    with pytest.raises(ContainerError, match="No space left"):
        update_ldcache(str(driver_image), [LIBDIR], libraries=INJECTED)
    monkeypatch.undo()
    assert not [n for n in os.listdir(driver_image / "etc") + os.listdir(driver_image / "etc/ld.so.conf.d")
                if ".nvct-" in n]


@needs_root
@needs_ldconfig
def test_a_restarted_container_cache_is_left_as_it_is(driver_image, monkeypatch):
    update_ldcache(str(driver_image), [LIBDIR], libraries=INJECTED)
    before = os.stat(driver_image / "etc/ld.so.cache")
    runs = _ldconfig_runs(monkeypatch)
    update_ldcache(str(driver_image), [LIBDIR], libraries=INJECTED)
    after = os.stat(driver_image / "etc/ld.so.cache")
    assert runs == [] and (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


@needs_root
@needs_ldconfig
@pytest.mark.parametrize("change", ["no cache", "old format", "glibc-hwcaps twice", "not an x86-64 library",
                                    "missing library"])
def test_ldconfig_runs_where_the_cache_cannot_be_patched_exactly(driver_image, built, monkeypatch, change):
    libraries = list(INJECTED)
    cache = driver_image / "etc/ld.so.cache"
    if change == "no cache":
        cache.unlink()
    elif change == "old format":
        cache.write_bytes(b"ld.so-1.7.0\0" + bytes(4))
    elif change == "glibc-hwcaps twice":  # glibc reads the last; a patch would move the shared bytes twice
        from tests.rootfs.test_cachepatch import GEN, HW, _relaid

        cache.write_bytes(_relaid(cache.read_bytes(), [GEN, HW, HW]))
    elif change == "not an x86-64 library":
        (driver_image / "usr/lib/libnvctbar.so.1").write_text("not ELF")
        libraries.append("/usr/lib/libnvctbar.so.1")
    else:
        libraries.append(f"{LIBDIR}/libnvctgone.so.1")
    runs = _ldconfig_runs(monkeypatch)
    update_ldcache(str(driver_image), [LIBDIR], libraries=libraries)
    assert len(runs) == 1
    listing = _cache_listing(driver_image)
    assert f"libnvctfoo.so.1 (libc6,x86-64) => {LIBDIR}/libnvctfoo.so.1" in listing
    assert 'hwcap: "x86-64-v2"' in listing  # ldconfig wrote the image's glibc-hwcaps entry afresh
