"""A minimal container root filesystem built from the host's own binaries.

Just enough for injection tests: busybox for a shell, the host's glibc loader
and libc so dynamically linked programs run, a *static* ldconfig and the
Debian ld.so.conf layout so a hook can refresh the cache, and ``dlopen-probe``
to see what an application inside the container would actually load.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile

BUSYBOX = "/bin/busybox"
LDCONFIG = "/sbin/ldconfig"
LOADER = "/lib64/ld-linux-x86-64.so.2"
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
GLIBC_EXTRA = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
MULTIARCH = "x86_64-linux-gnu"
PROBE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlopen_probe.c")
#: Where the probe lives inside the rootfs.
PROBE = "/usr/local/bin/dlopen-probe"

# Debian 12's files, verbatim in content (not the host's: it may have extras).
_LD_SO_CONF = "include /etc/ld.so.conf.d/*.conf\n\n"
_LD_SO_CONF_D = {
    "libc.conf": "# libc default configuration\n/usr/local/lib\n",
    f"{MULTIARCH}.conf": ("# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n"
                          "/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"),
}
_PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
           "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
_GROUP = "root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n"

_bases: dict[bool, str] = {}


class RootfsError(RuntimeError):
    """The host lacks something the test rootfs is made of."""


def build_base_rootfs(dest: str, *, merged_usr: bool = False) -> str:
    """Build the minimal rootfs in ``dest`` (created; must not exist) and return it.

    ``merged_usr`` gives the layout of current Debian images (``/lib`` ->
    ``usr/lib`` etc.); the default keeps real top-level directories, with
    ``/lib64/ld-linux-x86-64.so.2`` an absolute symlink as on Debian.
    """
    os.makedirs(dest, mode=0o755)
    os.chmod(dest, 0o755)
    _make_dirs(dest, merged_usr)
    _install(BUSYBOX, dest, "/bin/busybox", need_static=True)
    _link_applets(dest)
    _install(LOADER, dest, f"/lib/{MULTIARCH}/ld-linux-x86-64.so.2")
    _install(LIBC, dest, f"/lib/{MULTIARCH}/libc.so.6")
    # What any glibc image has and the driver's libraries need (DT_NEEDED of libcuda).
    for name in GLIBC_EXTRA:
        _install(f"/lib/{MULTIARCH}/{name}", dest, f"/lib/{MULTIARCH}/{name}")
    os.symlink(f"/lib/{MULTIARCH}/ld-linux-x86-64.so.2",
               _host(dest, "/lib64/ld-linux-x86-64.so.2"))
    _install(LDCONFIG, dest, "/sbin/ldconfig", need_static=True)
    _write(dest, "/etc/ld.so.conf", _LD_SO_CONF)
    for name, text in _LD_SO_CONF_D.items():
        _write(dest, f"/etc/ld.so.conf.d/{name}", text)
    _write(dest, "/etc/passwd", _PASSWD)
    _write(dest, "/etc/group", _GROUP)
    _compile_probe(_host(dest, PROBE))
    refresh_ld_cache(dest)
    return dest


def refresh_ld_cache(rootfs: str) -> None:
    """(Re)write ``<rootfs>/etc/ld.so.cache`` with the host's ldconfig.

    ``ldconfig -r`` chroots: as non-root it runs in a user namespace.
    """
    proc = subprocess.run([*as_root(), LDCONFIG, "-r", rootfs], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RootfsError(f"{LDCONFIG} -r {rootfs} failed: {proc.stderr.strip()}")


def as_root() -> list[str]:
    """Prefix for commands that need root just to chroot (none needed when root)."""
    return [] if os.geteuid() == 0 else ["unshare", "--map-root-user"]


def run_in_rootfs(rootfs: str, *argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` chrooted into ``rootfs`` (no container: just to inspect it)."""
    return subprocess.run([*as_root(), "chroot", rootfs, *argv], capture_output=True,
                          text=True)


def base_rootfs(*, merged_usr: bool = False) -> str:
    """The process-wide cached base rootfs, built on first use. Never modify it."""
    if merged_usr not in _bases:
        parent = tempfile.mkdtemp(prefix="nvct-rootfs-")
        atexit.register(shutil.rmtree, parent, True)
        _bases[merged_usr] = build_base_rootfs(os.path.join(parent, "rootfs"),
                                               merged_usr=merged_usr)
    return _bases[merged_usr]


def make_rootfs(parent: str | os.PathLike, *, name: str = "rootfs",
                merged_usr: bool = False) -> str:
    """A private copy of the base rootfs at ``parent/name``: hooks may write into it."""
    os.makedirs(parent, exist_ok=True)
    dest = os.path.join(os.fspath(parent), name)
    subprocess.run(["cp", "-a", base_rootfs(merged_usr=merged_usr), dest], check=True)
    return dest


def _make_dirs(dest: str, merged_usr: bool) -> None:
    top = ["bin", "sbin", "lib", "lib64"]
    if merged_usr:
        for name in top:
            os.makedirs(os.path.join(dest, "usr", name))
            os.symlink(f"usr/{name}", os.path.join(dest, name))
    else:
        for name in top:
            os.makedirs(os.path.join(dest, name))
    for path in (f"lib/{MULTIARCH}", f"usr/lib/{MULTIARCH}", "usr/bin", "usr/sbin",
                 "usr/local/bin", "usr/local/lib", "etc/ld.so.conf.d",
                 "proc", "dev", "sys", "run", "var", "root"):
        os.makedirs(_host(dest, "/" + path), exist_ok=True)
    for path, mode in (("tmp", 0o1777), ("var/tmp", 0o1777)):
        os.makedirs(_host(dest, "/" + path))
        os.chmod(_host(dest, "/" + path), mode)
    os.chmod(_host(dest, "/root"), 0o700)


def _host(rootfs: str, inner: str) -> str:
    """Host path of ``inner`` in a rootfs we are building (we control its symlinks)."""
    return os.path.join(rootfs, inner.lstrip("/"))


def _install(src: str, rootfs: str, inner: str, *, need_static: bool = False) -> None:
    real = os.path.realpath(src)
    if not os.path.isfile(real):
        raise RootfsError(f"{src} is missing on this host")
    if need_static and _is_dynamic(real):
        raise RootfsError(f"{src} must be statically linked (it runs without libraries)")
    shutil.copy2(real, _host(rootfs, inner))


def _is_dynamic(path: str) -> bool:
    from elftools.elf.elffile import ELFFile  # here: tests.support imports where pyelftools is absent (a GPU node)

    with open(path, "rb") as f:
        return any(seg["p_type"] == "PT_INTERP" for seg in ELFFile(f).iter_segments())


def _link_applets(rootfs: str) -> None:
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        link = _host(rootfs, f"/bin/{applet}")
        if applet != "busybox" and not os.path.lexists(link):
            os.symlink("busybox", link)


def _write(rootfs: str, inner: str, text: str) -> None:
    with open(_host(rootfs, inner), "w") as f:
        f.write(text)


def _compile_probe(out: str) -> None:
    proc = subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", out, PROBE_SOURCE],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RootfsError(f"compiling {PROBE_SOURCE} failed: {proc.stderr.strip()}")
