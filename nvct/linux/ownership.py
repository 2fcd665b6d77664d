"""Who besides root could change a file: the one rule for trees that privileged programs run from.

``nvct doctor`` checks the node's programs with it (:mod:`nvct.doctor.permissions`);
``nvct toolkit install`` checks its tree with it before switching it in.
"""

from __future__ import annotations

import os
import stat


def weakness(st: os.stat_result, owners: tuple[int, ...] = (0,), *, above: bool = False) -> str | None:
    """Why someone other than ``owners`` could change this entry, or None.

    ``above``: a directory above the chain, where a sticky world-writable one (``/tmp``) is safe,
    since nobody may rename or remove another's entry in it.
    """
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}"
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode means nothing; its target is checked where it matters
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return f"not a file or directory (mode {st.st_mode:o})"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        if above and stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX:
            return None
        who = "world" if mode & stat.S_IWOTH else f"group {st.st_gid}"
        return f"mode {mode:04o}, {who}-writable"
    return None


def tree_weaknesses(root: str, owners: tuple[int, ...] = (0,)) -> list[tuple[str, str]]:
    """(path, why) for ``root`` and every entry below it (links not followed)."""
    found = []
    for path in walk(root):
        try:
            why = weakness(os.lstat(path), owners)
        except OSError:
            continue
        if why:
            found.append((path, why))
    return found


def ancestor_weaknesses(path: str, owners: tuple[int, ...] = (0,)) -> list[tuple[str, str]]:
    """(dir, why) for each directory above ``path`` that someone else could change."""
    found = []
    for directory in ancestors(path):
        try:
            why = weakness(os.lstat(directory), owners, above=True)
        except OSError:
            continue
        if why:
            found.append((directory, why))
    return found


def walk(root: str):
    yield root
    if os.path.isdir(root) and not os.path.islink(root):
        for directory, dirs, names in os.walk(root):
            for name in dirs + names:
                yield os.path.join(directory, name)


def ancestors(path: str) -> list[str]:
    out = []
    current = os.path.dirname(os.path.abspath(path))
    while True:
        out.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            return out
        current = parent
