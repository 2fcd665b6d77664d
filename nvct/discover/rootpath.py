"""Paths under a driver root, its symlinks followed as if that root were ``/``."""

from __future__ import annotations

import os


def resolve_in_root(root: str, path: str, _hops: int = 40) -> str | None:
    """Follow symlinks of ``path`` as if ``root`` were ``/``; the result is root-relative.

    The driver root is trusted, but its links are absolute from its own point
    of view (``/usr/lib/...``), so os.path.realpath would leave it.
    """
    result = walk_in_root(root, path, _hops)
    return result if result is not None and os.path.exists(join_root(root, result)) else None


def walk_in_root(root: str, path: str, hops: int, links: list[tuple[str, str]] | None = None) -> str | None:
    """The root-relative path ``path`` names once its links are followed inside ``root``.

    Each link met is added to ``links`` (as (link, its target as written)).
    None when a component is missing or more than ``hops`` links are met; the
    last component itself is not checked (callers differ on a dangling link).
    """
    parts = [p for p in path.split("/") if p and p != "."]
    resolved: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        current = "/" + "/".join(resolved + [part])
        try:
            target = os.readlink(join_root(root, current))
        except FileNotFoundError:
            return None
        except OSError:
            resolved.append(part)
            continue
        hops -= 1
        if hops < 0:
            return None
        if links is not None:
            links.append((current, target))
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p and p != "."] + parts
    return "/" + "/".join(resolved)


def join_root(root: str, path: str) -> str:
    """``path`` (absolute inside ``root``) as a path from here."""
    if root in ("", "/"):
        return path if path.startswith("/") else "/" + path
    return root.rstrip("/") + "/" + path.lstrip("/")
