"""Paths under a driver root, its links followed inside it (nvct.discover.rootpath)."""

from __future__ import annotations

import os

from nvct.discover.rootpath import resolve_in_root


def test_resolve_in_root_keeps_absolute_links_inside(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/libx.so.1.0").write_text("")
    os.symlink("/usr/lib/libx.so.1.0", tmp_path / "usr/lib/libx.so.1")
    os.symlink("/etc/passwd", tmp_path / "usr/lib/escape")
    assert resolve_in_root(str(tmp_path), "/usr/lib/libx.so.1") == "/usr/lib/libx.so.1.0"
    assert resolve_in_root(str(tmp_path), "/usr/lib/escape") is None  # /etc/passwd is not in the root
    os.symlink("loop", tmp_path / "loop")
    assert resolve_in_root(str(tmp_path), "/loop") is None
