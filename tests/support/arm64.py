"""aarch64 containers on an x86-64 machine: qemu-user-static through binfmt_misc, an arm64 rootfs.

The rootfs is made of Debian's own arm64 packages (libc6, libc-bin for its
ldconfig, busybox-static), which scripts/setup.sh downloads into
``build/arm64-debs`` through a private apt state (the host's dpkg
architectures stay as they are). qemu's binfmt_misc entry is registered with
the ``F`` flag: the kernel opens the interpreter at registration, so it runs
arm64 programs inside containers and chroots that do not have qemu.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEBS = os.path.join(REPO, "build", "arm64-debs")
PACKAGES = ("libc6", "libc-bin", "busybox-static")
BINFMT = "/proc/sys/fs/binfmt_misc"
QEMU_CONF = "/usr/lib/binfmt.d/qemu-aarch64.conf"  # Debian's qemu-user-static: flags OPF
MULTIARCH = "aarch64-linux-gnu"
PROBE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dlopen_probe.c")
PROBE = "/usr/local/bin/dlopen-probe"
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
_GROUP = "root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n"

_cache: dict[str, str] = {}


class Arm64Error(RuntimeError):
    """This machine cannot run arm64 programs (what is missing, and what to run)."""


def ensure_binfmt() -> None:
    """qemu-aarch64 registered with binfmt_misc, flag F (root; mounts binfmt_misc if needed)."""
    entry = os.path.join(BINFMT, "qemu-aarch64")
    if not os.path.exists(os.path.join(BINFMT, "register")):
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT], check=True, capture_output=True)
    if os.path.exists(entry):
        with open(entry) as f:
            text = f.read()
        flags = next((line.split()[1] for line in text.splitlines() if line.startswith("flags:")), "")
        if text.startswith("enabled") and "F" in flags:
            return
        with open(entry, "w") as f:  # disabled, or registered without F: unusable inside containers
            f.write("-1")
    if not os.path.exists(QEMU_CONF):
        raise Arm64Error(f"{QEMU_CONF} missing: install qemu-user-static (scripts/setup.sh)")
    with open(QEMU_CONF) as f:
        line = next(ln.strip() for ln in f if ln.startswith(":qemu-aarch64:"))
    if "F" not in line.rsplit(":", 1)[1]:
        line += "F"
    with open(os.path.join(BINFMT, "register"), "w") as f:
        f.write(line)


def debs() -> list[str]:
    found = [p for name in PACKAGES for p in sorted(glob.glob(os.path.join(DEBS, f"{name}_*_arm64.deb")))[-1:]]
    if len(found) != len(PACKAGES):
        raise Arm64Error(f"{DEBS}: Debian's arm64 {', '.join(PACKAGES)} packages missing: run scripts/setup.sh")
    return found


def packages_root() -> str:
    """Debian's arm64 packages unpacked once per process (never modify it)."""
    if "packages" not in _cache:
        parent = tempfile.mkdtemp(prefix="nvct-arm64-")
        atexit.register(shutil.rmtree, parent, True)
        root = os.path.join(parent, "packages")
        os.makedirs(root)
        for deb in debs():
            subprocess.run(["dpkg-deb", "-x", deb, root], check=True, capture_output=True)
        _cache["packages"] = root
    return _cache["packages"]


def ldconfig() -> str:
    """Debian arm64's ldconfig (static-pie), run through binfmt_misc."""
    return os.path.join(packages_root(), "sbin", "ldconfig")


def build_rootfs(dest: str) -> str:
    """An arm64 rootfs at ``dest``: Debian's arm64 packages, busybox applets, a dlopen probe, its ld cache."""
    from nvct.simulate.native import compiler

    ensure_binfmt()
    shutil.copytree(packages_root(), dest, symlinks=True)
    busybox = os.path.join(dest, "bin", "busybox")
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        link = os.path.join(dest, "bin", applet)
        if applet != "busybox" and not os.path.lexists(link):
            os.symlink("busybox", link)
    for d in ("proc", "dev", "sys", "run", "root", "usr/local/bin", f"usr/lib/{MULTIARCH}"):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
    for d in ("tmp", "var/tmp"):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
        os.chmod(os.path.join(dest, d), 0o1777)
    for rel, text in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
        with open(os.path.join(dest, rel), "w") as f:
            f.write(text)
    probe = os.path.join(dest, PROBE.lstrip("/"))
    proc = subprocess.run([*compiler("aarch64"), "-O2", "-Wall", "-Werror", "-o", probe, PROBE_SOURCE],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Arm64Error(f"compiling {PROBE_SOURCE} for aarch64 failed: {proc.stderr.strip()}")
    proc = subprocess.run([ldconfig(), "-r", dest], capture_output=True, text=True)
    if proc.returncode != 0:
        raise Arm64Error(f"arm64 ldconfig -r {dest} failed: {proc.stderr.strip()}")
    return dest


def grace_node(base_dir: str | os.PathLike) -> dict:
    """The simulated aarch64 node (a GH200) under ``base_dir``, built once; root, binfmt_misc registered."""
    from nvct.simulate.node import cached_node

    ensure_binfmt()
    os.environ["NVCT_SIMULATE_LDCONFIG_AARCH64"] = ldconfig()
    try:
        return cached_node(base_dir, arch="aarch64")
    finally:
        del os.environ["NVCT_SIMULATE_LDCONFIG_AARCH64"]


def make_rootfs(parent: str | os.PathLike, name: str = "rootfs-arm64") -> str:
    """A private copy of the process's arm64 base rootfs at ``parent/name``."""
    if "base" not in _cache:
        parent_base = tempfile.mkdtemp(prefix="nvct-arm64-rootfs-")
        atexit.register(shutil.rmtree, parent_base, True)
        _cache["base"] = build_rootfs(os.path.join(parent_base, "rootfs"))
    dest = os.path.join(os.fspath(parent), name)
    subprocess.run(["cp", "-a", _cache["base"], dest], check=True)
    return dest
