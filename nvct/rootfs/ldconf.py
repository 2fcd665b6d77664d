"""Following an image's ld.so.conf as ldconfig will, before it runs.

ldconfig blocks forever on a FIFO and recurses without end on a file that
includes itself: checked here first, through the verified root.
"""

from __future__ import annotations

import os

from nvct.base.errors import ContainerError

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.rootfs.root import Rootfs

_MAX_CONF_FILES = 512


def check_conf(root: Rootfs, path: str = "/etc/ld.so.conf") -> None:
    """Follow the image's ld.so.conf and its ``include`` lines as ldconfig will, first.

    ldconfig blocks forever on a FIFO and recurses without end on a file
    that includes itself; both would hold the container's start until the
    time limit. Here they fail at once with one line. Every file must be a
    regular file (Rootfs.open refuses anything else) and no include chain
    may come back to a file it passed.
    """
    count = [0]

    def visit(conf: str, chain: tuple[str, ...]) -> None:
        real = root.realpath(conf)
        if real in chain:
            raise ContainerError(f"{conf} in container root {root.path}: ld.so.conf includes "
                                 "itself; refusing to run ldconfig on it")
        count[0] += 1
        if count[0] > _MAX_CONF_FILES:
            raise ContainerError(f"{path} in container root {root.path}: includes more than "
                                 f"{_MAX_CONF_FILES} files; refusing to run ldconfig on it")
        text = root.read_file(conf).decode("utf-8", "replace")
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("include") or line[7:8] not in (" ", "\t"):
                continue
            for pattern in line[8:].split():
                if not pattern.startswith("/"):
                    pattern = os.path.join(os.path.dirname(real), pattern)
                for found in _glob(root, pattern):
                    visit(found, chain + (real,))

    if root.exists(path):
        visit(path, ())


def _glob(root: Rootfs, pattern: str) -> list[str]:
    """glob(3) inside the root, sorted as ldconfig sees it; directories are skipped."""
    paths = ["/"]
    parts = [p for p in pattern.split("/") if p]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt = []
        for base in paths:
            if not any(c in part for c in "*?["):
                nxt.append(_join(base, part))
                continue
            try:
                names = root.listdir(base)
            except ContainerError:
                continue
            nxt.extend(_join(base, n) for n in sorted(names) if _match(n, part)
                       and (not n.startswith(".") or part.startswith(".")))
        paths = nxt
        if not last:
            paths = [p for p in paths if root.exists(p)]
    return [p for p in paths if root.exists(p) and not _is_dir(root, p)]


def _match(name: str, pattern: str) -> bool:
    """fnmatch without importing re (this runs on every container start)."""
    if "[" in pattern:
        import fnmatch

        return fnmatch.fnmatchcase(name, pattern)
    # Greedy wildcard matching with one backtrack point: linear for '*' and '?'.
    n = p = 0
    star, mark = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] in ("?", name[n]):
            n, p = n + 1, p + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark, p = p, n, p + 1
        elif star >= 0:
            mark += 1
            n, p = mark, star + 1
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _is_dir(root: Rootfs, path: str) -> bool:
    try:
        root.listdir(path)
        return True
    except ContainerError:
        return False
