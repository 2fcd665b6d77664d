"""Mount targets an image symlink leads into a host directory the engine bind-mounts.

runc and crun create a missing mount target by following the image's
symlinks inside the root, after the mounts listed before it are in place.
The engine's own bind mounts (a user's ``-v /host:/data`` volume, docker's
``/dev/shm``) come before nvct's, so an image whose library folder is a
symlink to ``/data`` would have the runtime create nvct's targets in the
host's directory. nvct's writable mounts go last (nvct.edits.model.writable_last);
this check refuses the start when an image symlink leads one of nvct's
targets into an earlier bind mount of a host directory.

:func:`check_proc` refuses a GPU container's spec mount at or under /proc:
the driver's params are masked there, and a volume would put a host file
under that mask (docs/security.md).

Read-only detection on the image as it is at create time (nothing here
changes or mounts anything); standard library only, no ctypes (but for a
bind over /proc, whose source must be a procfs).
"""

from __future__ import annotations

import os
import posixpath
import stat

from nvct.base.errors import SpecError

_MAX_HOPS = 40


def check(spec: dict, rootfs: str, targets) -> None:
    """Raise SpecError if an image symlink leads a target in ``targets`` into an engine bind mount."""
    ours = {"/" + posixpath.normpath("/" + t).lstrip("/") for t in targets}
    binds = []
    for m in spec.get("mounts") or ():
        dest = "/" + posixpath.normpath(m.get("destination") or "/").lstrip("/")
        bind = m.get("type") == "bind" or any(o in ("bind", "rbind") for o in m.get("options") or ())
        if bind and dest not in ours and dest != "/" and os.path.isdir(m.get("source") or ""):
            binds.append(dest)
    if not binds:
        return
    seen: set[str] = set()
    for target in targets:
        parent = "/" + posixpath.dirname(posixpath.normpath("/" + target)).lstrip("/")
        if parent in seen:
            continue
        seen.add(parent)
        real = _in_root(rootfs, parent)
        if real == parent:
            continue
        for dest in binds:
            if _under(real, dest) and not _under(parent, dest):
                raise SpecError(f"mount target {target}: the image's symlinks lead {parent} into "
                                f"the bind mount at {dest} (a host directory); refusing to start")


#: Spec mounts runc allows under /proc: files LXCFS emulates, never on the driver's path.
_PROC_FILES = frozenset(("/proc/cpuinfo", "/proc/diskstats", "/proc/meminfo", "/proc/stat", "/proc/swaps",
                         "/proc/uptime", "/proc/loadavg", "/proc/slabinfo", "/proc/net/dev",
                         "/proc/sys/kernel/ns_last_pid"))


def check_proc(spec: dict, rootfs: str | None) -> None:
    """Raise SpecError for a spec mount (a volume) at or under /proc, named as the spec names it.

    The runtime's own procfs (type ``proc``, or runc's bind of a procfs) and
    the files runc allows there are fine. A destination is judged as written
    and, with ``rootfs``, where the image's symlinks lead it (``/data ->
    /proc/driver``). The params mask checks its target itself too
    (nvct.hooks.procmask.kernel_proc_path): this names the mount at fault.
    """
    for m in spec.get("mounts") or ():
        dest = m.get("destination") if isinstance(m, dict) else None
        if not isinstance(dest, str):
            continue
        named = "/" + posixpath.normpath("/" + dest).lstrip("/")
        for path in {named, _in_root(rootfs, named) if rootfs else named}:
            if _under(path, "/proc") and path not in _PROC_FILES and not (path == "/proc" and _is_procfs(m)):
                raise SpecError(f"mount at {dest}: a GPU container may not mount anything at or under /proc "
                                "(the driver's params are masked there); refusing to start")


def _is_procfs(mount: dict) -> bool:
    if mount.get("type") == "proc":
        return True
    source = mount.get("source")
    if not isinstance(source, str) or not source.startswith("/"):
        return False
    from nvct.linux.fs import PROC_SUPER_MAGIC, fs_type

    try:
        fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fs_type(fd) == PROC_SUPER_MAGIC
    finally:
        os.close(fd)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _in_root(rootfs: str, path: str) -> str:
    """Where ``path`` leads inside the root, symlinks followed (clamped at the root); the
    missing rest is appended as named. Every lstat names only verified directories."""
    todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop()
        if part == "..":
            if done:
                done.pop()
            continue
        host = os.path.join(rootfs, *done, part)
        try:
            st = os.lstat(host)
        except OSError:
            return "/" + "/".join(done + [part] + list(reversed(todo)))
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_HOPS:
                break
            text = os.readlink(host)
            if text.startswith("/"):
                done = []
            todo.extend(p for p in reversed(text.split("/")) if p not in ("", "."))
            continue
        done.append(part)
        if not stat.S_ISDIR(st.st_mode):
            break
    return "/" + "/".join(done + list(reversed(todo)))
