"""Following an image's ld.so.conf before ldconfig runs (nvct.rootfs.ldconf): what would hang it fails at once."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import ContainerError
from nvct.rootfs import ldconf


@pytest.mark.parametrize("name, pattern, expected", [
    ("a.conf", "*.conf", True), ("a.con", "*.conf", False), ("x", "*", True), ("ab", "a?", True),
    ("aXbYc", "a*b*c", True), ("abd", "a*c", False), ("b.conf", "[ab].conf", True),
])
def test_glob_match_without_re(name, pattern, expected):
    assert ldconf._match(name, pattern) is expected


def _conf_root(tmp_path, files: dict):
    from nvct.rootfs.root import Rootfs

    for path, text in files.items():
        full = tmp_path / path.lstrip("/")
        full.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            os.mkfifo(full)
        else:
            full.write_text(text)
    return Rootfs(tmp_path)


def test_conf_check_follows_includes_like_ldconfig(tmp_path):
    with _conf_root(tmp_path, {"/etc/ld.so.conf": "include ld.so.conf.d/*.conf\n",
                               "/etc/ld.so.conf.d/a.conf": "/opt/a\n# include /nowhere\n",
                               "/etc/ld.so.conf.d/b.conf": "include /etc/extra/*.conf\n"}) as root:
        ldconf.check_conf(root)


#: Confs that would hang ldconfig, and the line that refuses each.
HANGING_CONFS = [
    ({"/etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n", "/etc/ld.so.conf.d/fifo.conf": None},
     "not a regular file"),
    ({"/etc/ld.so.conf": None}, "not a regular file"),
    ({"/etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
      "/etc/ld.so.conf.d/loop.conf": "include /etc/ld.so.conf\n"}, "includes itself"),
    ({"/etc/ld.so.conf": "include\t/etc/ld.so.conf\n"}, "includes itself"),
]


@pytest.mark.parametrize("files, line", HANGING_CONFS)
def test_conf_check_refuses_what_would_hang_ldconfig(tmp_path, files, line):
    refuse_conf(tmp_path, files, line)  # and within a second: tests/perf/test_rootfs.py


def refuse_conf(tmp_path, files: dict, line: str) -> None:
    with _conf_root(tmp_path, files) as root:
        with pytest.raises(ContainerError, match=line):
            ldconf.check_conf(root)
