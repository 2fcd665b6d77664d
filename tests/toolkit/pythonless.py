"""A node without Python (nor a glibc where programs look for one), and what its processes opened.

:func:`build_host` makes the node's ``/`` as a directory: busybox for ``/bin/sh``
and the few commands the launcher needs, Debian's static ``/sbin/ldconfig``,
and runc -- whose glibc (it is dynamically linked) lives in ``/opt/runc/lib``
only, named by runc's own ELF interpreter and rpath (patchelf), so
``/lib``, ``/lib64`` and ``/usr/lib`` hold no libc, no loader and no Python.

:func:`launcher` is an argv prefix that runs a program *as that node does*: in
a private mount namespace whose ``/`` is the tree (``pivot_root``, the old
root unmounted), with the machine's ``/proc``, ``/sys``, ``/dev`` and
``/tmp`` (the simulated driver, bundles and runc's state live there) bound
at the same paths, and a fresh ``/run``.

:func:`opened_by` reads an ``strace -ff`` trace: for every process running
a program under a directory (the toolkit), each file it opened or executed.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from nvct.toolkit import python as runtime

BUSYBOX = "/bin/busybox"
RUNC = "/usr/sbin/runc"
LDCONFIG = "/sbin/ldconfig"
#: Where the tree's runc finds its libc (nowhere a Python runtime would look).
RUNC_LIBS = "/opt/runc/lib"
BUSYBOX_APPLETS = ("sh", "umount", "mount", "cat", "ls", "true")
#: The toolkit directory on the node, as the GPU Operator's.
TOOLKIT_INSTALL_DIR = "/usr/local/nvidia"
STRACE = ("strace", "-ff", "-qq", "-y", "-s", "4096", "-e", "trace=open,openat,openat2,execve,execveat,clone,clone3,"
          "fork,vfork")

_LAUNCH = """\
set -e
tree=$1; shift
mount --bind "$tree" "$tree"
for d in proc sys dev tmp; do mount --rbind "/$d" "$tree/$d"; done
mount -t tmpfs -o mode=0755 tmpfs "$tree/run"
cwd=$PWD
cd "$tree"
pivot_root . .oldroot
/bin/busybox umount -l /.oldroot
cd "$cwd"
exec "$@"
"""


def build_host(tree: str) -> str:
    """The node's ``/`` in ``tree`` (see the module's docstring)."""
    for d in ("bin", "sbin", "usr/sbin", "usr/bin", "etc", "proc", "sys", "dev", "tmp", "run", ".oldroot",
              RUNC_LIBS.lstrip("/"), TOOLKIT_INSTALL_DIR.lstrip("/")):
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(tree, "bin/busybox"))
    for applet in BUSYBOX_APPLETS:
        os.symlink("busybox", os.path.join(tree, "bin", applet))
    shutil.copy2(LDCONFIG, os.path.join(tree, "sbin/ldconfig"))
    runc = os.path.join(tree, RUNC.lstrip("/"))
    shutil.copy2(RUNC, runc)
    libs = os.path.join(tree, RUNC_LIBS.lstrip("/"))
    loader = runtime.loader_of(RUNC)
    shutil.copy2(loader, os.path.join(libs, os.path.basename(loader)))
    runtime.copy_libraries(libs, libs, [RUNC])
    subprocess.run(["patchelf", "--set-interpreter", os.path.join(RUNC_LIBS, os.path.basename(loader)),
                    "--force-rpath", "--set-rpath", RUNC_LIBS, runc], check=True)
    with open(os.path.join(tree, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    return tree


def launcher(tree: str, scratch: str) -> list[str]:
    """The argv prefix that runs a program inside ``tree`` as ``/`` (the tree must not be under /tmp's
    bind: it is fine if it is, the bind is taken after)."""
    script = os.path.join(scratch, "enter-node.sh")
    with open(script, "w") as f:
        f.write(_LAUNCH)
    return ["unshare", "-m", "--propagation", "private", "/bin/sh", script, tree]


def opened_by(trace_prefix: str, under: str) -> dict[str, set[str]]:
    """From ``strace -ff -o trace_prefix`` files: program -> paths it opened or executed, for every
    process whose program (or the one it was forked from) lies under ``under``."""
    events: dict[int, list] = {}
    for path in glob.glob(trace_prefix + ".*"):
        pid = int(path.rsplit(".", 1)[1])
        with open(path, errors="replace") as f:
            events[pid] = [_parse(line) for line in f]
    children = {child for lines in events.values() for kind, child, _ in lines if kind == "fork"}
    out: dict[str, set[str]] = {}

    def walk(pid: int, program: str) -> None:
        for kind, value, ok in events.get(pid, ()):
            if kind == "fork":
                walk(value, program)
            elif kind == "exec" and ok:
                if program.startswith(under):
                    out.setdefault(program, set()).add(value)
                program = value
            elif kind == "open" and ok and program.startswith(under):
                out.setdefault(program, set()).add(value)

    for pid in sorted(set(events) - children):
        walk(pid, "")
    return out


_LINE = re.compile(r'^(\w+)\((?:(?:AT_FDCWD|-?\d+)(?:<([^>]*)>)?, )?"([^"]*)".*\)\s+= (-?\d+)')
_FORK = re.compile(r"^(clone3?|fork|vfork)\(.*\)\s+= (\d+)$")


def _parse(line: str):
    fork = _FORK.match(line)
    if fork:
        return "fork", int(fork.group(2)), True
    m = _LINE.match(line)
    if not m:
        return "other", line, False
    call, directory, path, result = m.groups()
    if directory and not path.startswith("/"):  # openat(fd<dir>, "relative"): strace -y names the dir
        # (also the cwd, for AT_FDCWD)
        path = os.path.join(directory, path) if path else directory
    kind = "exec" if call.startswith("execve") else "open"
    return kind, path, int(result) >= 0
