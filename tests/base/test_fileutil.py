"""Atomic replacement that leaves no temporary file behind, and directories opened through no link."""

import os
import subprocess
import sys

import pytest

from nvct.base import fileutil
from tests.support.fixtures import need_root


def _dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # gone (reused only after the pid space wraps)


def test_write_atomic_keeps_mode_and_owner_and_leaves_nothing_beside(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("old")
    path.chmod(0o640)
    fileutil.write_atomic(str(path), "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    fileutil.write_atomic(str(tmp_path / "fresh"), b"x", mode=0o600)
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["config.json", "fresh"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("old")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileutil.os, "write", full)
    with pytest.raises(OSError):
        fileutil.write_atomic(str(path), "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["config.json"]


def test_a_temporary_of_a_writer_that_is_gone_is_swept_by_the_next_write(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    names = [f".nvct-{dead}-0a1b2c3d.tmp", f".nvct-{dead}.tmp", f"runtimes.{dead}.tmp",  # the sh front's, older ones
             f".nvct-{alive}-0a1b2c3d.tmp", "keep.tmp", ".nvct-x.tmp", "config.json"]
    for name in names:
        (tmp_path / name).write_text("")
    fileutil.write_atomic(str(tmp_path / "config.json"), "{}")
    assert sorted(os.listdir(tmp_path)) == sorted([f".nvct-{alive}-0a1b2c3d.tmp", "keep.tmp", ".nvct-x.tmp",
                                                   "config.json"])
    old = 1_000_000_000  # an hour and more: stale even if its pid is someone's again
    os.utime(tmp_path / f".nvct-{alive}-0a1b2c3d.tmp", (old, old))
    fileutil.write_atomic(str(tmp_path / "config.json"), "{}")
    assert f".nvct-{alive}-0a1b2c3d.tmp" not in os.listdir(tmp_path)


def test_a_writer_killed_while_writing_leaves_no_file(tmp_path):
    """The content goes into an unnamed file (O_TMPFILE): killed in the middle, nothing has a name."""
    code = ("import os, signal, sys; from nvct.base import fileutil\n"
            "real = os.write\n"
            "def write(fd, data):\n"
            "    real(fd, bytes(data[:10]))\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "os.write = write\n"
            f"fileutil.write_atomic({str(tmp_path / 'config.json')!r}, b'x' * 100000)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert r.returncode == -9
    assert os.listdir(tmp_path) == []


def test_open_dir_follows_no_symlink_in_any_component(tmp_path):
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    os.close(fileutil.open_dir(str(tmp_path / "real" / "sub")))
    for path in (tmp_path / "link" / "sub", tmp_path / "link"):
        with pytest.raises(OSError):
            fileutil.open_dir(str(path))
    fd = fileutil.open_dir(str(tmp_path / "real" / "new"), create_mode=0o700)
    os.close(fd)
    assert (tmp_path / "real" / "new").stat().st_mode & 0o777 == 0o700


def test_open_private_dir_refuses_a_link_and_a_folder_others_may_write(tmp_path):
    need_root("ownership")
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "open").mkdir(mode=0o777)
        (tmp_path / "open").chmod(0o777)
        (tmp_path / "link").symlink_to(tmp_path / "ok")
        assert fileutil.open_private_dir(top, "open") is None
        assert fileutil.open_private_dir(top, "link") is None
        fd = fileutil.open_private_dir(top, "ok")
        assert fd is not None
        os.close(fd)
        assert (tmp_path / "ok").stat().st_mode & 0o777 == 0o700
    finally:
        os.close(top)
