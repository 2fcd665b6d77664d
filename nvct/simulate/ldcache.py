"""The node's ld.so.cache: made and read by the real ldconfig.

A genuine cache (not one written by nvct) keeps the simulation honest: nvct's
own cache parser is tested against what glibc produces.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from nvct.errors import NvctError

#: ld.so.conf as on Debian/Ubuntu (multiarch).
LD_SO_CONF = {
    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n\n",
    "etc/ld.so.conf.d/libc.conf": "# libc default configuration\n/usr/local/lib\n",
    "etc/ld.so.conf.d/x86_64-linux-gnu.conf": ("# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n"
                                               "/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"),
    "etc/ld.so.conf.d/i386-linux-gnu.conf": ("# Multiarch support\n/usr/local/lib/i386-linux-gnu\n"
                                             "/lib/i386-linux-gnu\n/usr/lib/i386-linux-gnu\n"
                                             "/usr/local/lib/i686-linux-gnu\n/lib/i686-linux-gnu\n"
                                             "/usr/lib/i686-linux-gnu\n"),
}


def ldconfig_binary() -> str:
    found = shutil.which("ldconfig", path=os.pathsep.join([os.environ.get("PATH", ""), "/sbin", "/usr/sbin"]))
    if found is None:
        raise NvctError("building a simulated node needs ldconfig (not found in PATH, /sbin or /usr/sbin)")
    return found


def generate(root: str) -> None:
    """Run ``ldconfig -X -r ROOT`` (it chroots: as non-root, inside a user namespace)."""
    argv = [ldconfig_binary(), "-X", "-r", root]
    if os.geteuid() != 0:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise NvctError("building a simulated node as non-root needs unshare(1) for `ldconfig -r`")
        argv = [unshare, "--user", "--map-root-user"] + argv
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not os.path.isfile(os.path.join(root, "etc/ld.so.cache")):
        raise NvctError(f"ldconfig -r {root} failed: {proc.stderr.strip() or f'exit status {proc.returncode}'}")


def entries(root: str) -> list[tuple[str, str, str]]:
    """(name, arch, path) for each entry of ROOT/etc/ld.so.cache, as ``ldconfig -p`` lists them."""
    cache = os.path.join(root, "etc/ld.so.cache")
    proc = subprocess.run([ldconfig_binary(), "-p", "-C", cache], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise NvctError(f"{cache}: ldconfig -p failed: {proc.stderr.strip()}")
    out = []
    for line in proc.stdout.splitlines():
        if not line.startswith("\t") or " => " not in line:
            continue
        left, path = line.strip().split(" => ", 1)
        name, _, flags = left.partition(" (")
        out.append((name, "x86_64" if "x86-64" in flags else "i386", path))
    return out
