"""The node's ld.so.cache: made and read by the real ldconfig.

A genuine cache (not one written by nvct) keeps the simulation honest: nvct's
own cache parser is tested against what glibc produces.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from nvct.base.errors import NvctError

#: ld.so.conf as on Debian/Ubuntu (multiarch), x86-64.
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


#: The same on Debian/Ubuntu arm64 (no 32-bit libraries).
LD_SO_CONF_AARCH64 = {
    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n\n",
    "etc/ld.so.conf.d/libc.conf": "# libc default configuration\n/usr/local/lib\n",
    "etc/ld.so.conf.d/aarch64-linux-gnu.conf": ("# Multiarch support\n/usr/local/lib/aarch64-linux-gnu\n"
                                                "/lib/aarch64-linux-gnu\n/usr/lib/aarch64-linux-gnu\n"),
}
#: An ldconfig of another architecture than this machine's (run through binfmt_misc, e.g. qemu-user-static).
LDCONFIG_ENV = "NVCT_SIMULATE_LDCONFIG_{arch}"
_UNAME = {"arm64": "aarch64"}


def ld_so_conf(arch: str = "x86_64") -> dict:
    return LD_SO_CONF_AARCH64 if arch == "aarch64" else LD_SO_CONF


def ldconfig_binary(arch: str | None = None) -> str:
    """This machine's ldconfig; for a node of another ``arch``, that arch's, named by the environment.

    A genuine cache comes only from an ldconfig of the node's architecture:
    this machine's ignores libraries of any other.
    """
    machine = os.uname().machine
    if arch is not None and arch != _UNAME.get(machine, machine):
        var = LDCONFIG_ENV.format(arch=arch.upper())
        found = os.environ.get(var)
        if not found or not os.path.isfile(found):
            raise NvctError(f"building an {arch} node on {machine} needs an {arch} ldconfig: set {var} to one "
                            f"(Debian: the {arch} libc-bin package's /sbin/ldconfig), run through binfmt_misc "
                            f"(qemu-user-static)")
        return found
    found = shutil.which("ldconfig", path=os.pathsep.join([os.environ.get("PATH", ""), "/sbin", "/usr/sbin"]))
    if found is None:
        raise NvctError("building a simulated node needs ldconfig (not found in PATH, /sbin or /usr/sbin)")
    return found


def generate(root: str, arch: str | None = None) -> None:
    """Run ``ldconfig -X -r ROOT`` (it chroots: as non-root, inside a user namespace)."""
    argv = [ldconfig_binary(arch), "-X", "-r", root]
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
        out.append((name, "x86_64" if "x86-64" in flags else "aarch64" if "AArch64" in flags else "i386", path))
    return out
