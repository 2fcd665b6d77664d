"""Mount targets an image symlink leads into a host directory the engine bind-mounts.

runc and crun create a missing mount target by following the image's
symlinks inside the root, after the mounts listed before it are in place.
The engine's own bind mounts (a user's ``-v /host:/data`` volume, docker's
``/dev/shm``) come before nvct's, so an image whose library folder is a
symlink to ``/data`` would have the runtime create nvct's targets in the
host's directory. nvct's writable mounts go last (nvct.edits.writable_last);
this check refuses the start when an image symlink leads one of nvct's
targets into an earlier bind mount of a host directory.

Read-only detection on the image as it is at create time (nothing here
changes or mounts anything); standard library only, no ctypes.
"""

from __future__ import annotations

import os
import posixpath
import stat

from nvct.errors import SpecError

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
