"""Images that aim the ld cache update at the host (CVE-2025-23267 class).

/etc/ld.so.conf.d, /etc/ld.so.cache, /etc itself or a listed library folder
are symlinks to host paths. The conf file is written through Rootfs; ldconfig
runs chrooted with procfs detached, so whatever it follows stays inside; the
cache patch that replaces ldconfig for nvct's own steps (``patched``) reads
and writes only through Rootfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from nvct.linux.fs import MS_NOSUID, mount
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.rootfs import sandbox
from nvct.rootfs.ldconfig import update_ldcache

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, namespaces)"),
    pytest.mark.skipif(not os.path.exists("/sbin/ldconfig"), reason="needs /sbin/ldconfig"),
]
FOLDER = "/opt/nv/lib"


@pytest.fixture
def ldscene(scene, shared_library):
    """The scene, with a real library in the host's lib dir and in the image."""
    shutil.copy(shared_library, scene.host / "lib")
    (scene.root / FOLDER.lstrip("/")).mkdir(parents=True)
    shutil.copy(shared_library, scene.root / FOLDER.lstrip("/"))
    (scene.root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    os.symlink("libnvctfoo.so.1.0", scene.root / FOLDER.lstrip("/") / "libnvctfoo.so.1")  # create-symlinks'
    subprocess.run(["/sbin/ldconfig", "-r", str(scene.root), "-C", "/etc/ld.so.cache"], check=True)
    scene.freeze()
    return scene


def _update(scene, proc=False, folders=(FOLDER,), patched=False):
    libraries = [f"{FOLDER}/libnvctfoo.so.1"] if patched else []
    errors, _ = scene.attempt([lambda r: update_ldcache(str(scene.root), list(folders), libraries=libraries)],
                              proc=proc)
    return errors[0]


@pytest.mark.parametrize("kind", ["absolute", "relative", "magic"])
@pytest.mark.parametrize("patched", [False, True], ids=["ldconfig", "patched"])
def test_symlinked_conf_dir_is_not_written_through(ldscene, kind, patched):
    ldscene.link("/etc/ld.so.conf.d", kind, ldscene.host / "etc/ld.so.conf.d")
    error = _update(ldscene, proc=kind == "magic", patched=patched)
    assert error and ("dangling symlink" in error or "symbolic links" in error)
    ldscene.assert_host_untouched()


@pytest.mark.parametrize("kind", ["absolute", "relative"])
@pytest.mark.parametrize("patched", [False, True], ids=["ldconfig", "patched"])
def test_symlinked_etc_is_not_written_through(ldscene, kind, patched):
    shutil.rmtree(ldscene.root / "etc")
    ldscene.link("/etc", kind, ldscene.host / "etc")
    error = _update(ldscene, patched=patched)
    assert error and "dangling symlink" in error
    ldscene.assert_host_untouched()


@pytest.mark.parametrize("kind", ["absolute", "relative", "magic"])
@pytest.mark.parametrize("patched", [False, True], ids=["ldconfig", "patched"])
def test_symlinked_cache_is_replaced_inside_the_root(ldscene, kind, patched, capless_pid):
    (ldscene.root / "etc/ld.so.cache").unlink()
    ldscene.link("/etc/ld.so.cache", kind, ldscene.host / "etc/ld.so.cache", pid=capless_pid)
    assert _update(ldscene, proc=kind == "magic", patched=patched) is None
    cache = ldscene.root / "etc/ld.so.cache"
    assert not cache.is_symlink()
    out = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(cache)], capture_output=True,
                         text=True, check=True).stdout
    assert f"=> {FOLDER}/libnvctfoo.so.1" in out
    ldscene.assert_host_untouched()


@pytest.mark.parametrize("kind", ["absolute", "relative", "magic"])
def test_symlinked_library_folder_stays_inside(ldscene, kind, capless_pid):
    shutil.rmtree(ldscene.root / FOLDER.lstrip("/"))
    ldscene.link(FOLDER, kind, ldscene.host / "lib", pid=capless_pid)
    assert _update(ldscene, proc=kind == "magic") is None
    # ldconfig creates SONAME links in the folders it scans: not in the host's
    assert not (ldscene.host / "lib/libnvctfoo.so.1").exists()
    ldscene.assert_host_untouched()


def test_without_the_procfs_detach_the_magic_link_escapes(tmp_path, shared_library,
                                                          monkeypatch, capless_pid):
    """Why procfs is detached: a chroot does not stop /proc/<pid>/root."""
    host_lib = tmp_path / "host/lib"
    host_lib.mkdir(parents=True)
    shutil.copy(shared_library, host_lib)
    root = tmp_path / "root"
    (root / "opt/nv").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / FOLDER.lstrip("/")).symlink_to(f"/proc/{capless_pid}/root{host_lib}")
    monkeypatch.setattr(sandbox, "_detach_pseudo_mounts", lambda root_real: None)

    def work():
        mount("proc", str(root / "proc"), "proc", MS_NOSUID)
        update_ldcache(str(root), [FOLDER])

    in_private_mount_namespace(work)
    assert os.readlink(host_lib / "libnvctfoo.so.1") == "libnvctfoo.so.1.0"


@pytest.mark.containers
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_an_image_cache_the_patch_cannot_prove_still_runs(tmp_path, sim_node, runtime):
    """An image whose ld cache names its glibc-hwcaps section four times over the same bytes
    (glibc reads the last): a patch moved those bytes once per name and every dynamic program
    crashed (SIGSEGV). Such a cache is left to ldconfig: the program runs, finds the image's
    glibc-hwcaps library, and libcuda (jit-cdi mode, through the real runtime)."""
    from tests.rootfs.test_cachepatch import GEN, HW, HWLIB, LIBDIR, _relaid, hwcaps_image
    from tests.support.gpu_runs import need_runtime, run_gpu

    need_runtime(runtime)
    root = hwcaps_image(tmp_path / "image")
    cache = os.path.join(root, "etc/ld.so.cache")
    with open(cache, "rb") as f:
        data = f.read()
    with open(cache, "wb") as f:
        f.write(_relaid(data, [GEN, HW, HW, HW, HW]))
    result = run_gpu(tmp_path, sim_node, root, mode="jit-cdi", runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command=f"dlopen-probe {HWLIB} libcuda.so.1")
    assert result.ok, result.describe()
    assert result.stdout.splitlines() == [f"ok {HWLIB} {LIBDIR}/glibc-hwcaps/x86-64-v2/{HWLIB}",
                                          f"ok libcuda.so.1 {LIBDIR}/libcuda.so.1"], result.describe()
