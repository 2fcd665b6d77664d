"""The installer's pid file: one installer per node, a clear error for the second."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvct.toolkit import PidFile, PidFileLocked
from tests.toolkit.installer import NVCT


def test_the_pid_file_holds_our_pid_and_goes_away(tmp_path):
    path = tmp_path / "run" / "toolkit.pid"
    with PidFile(str(path)):
        assert path.read_text() == f"{os.getpid()}\n"
    assert not path.exists()


def test_a_second_holder_is_refused_and_the_first_pid_kept(tmp_path):
    path = str(tmp_path / "toolkit.pid")
    with PidFile(path):
        with pytest.raises(PidFileLocked, match=f"{path}: locked by another nvct toolkit install "
                                                f"\\(pid {os.getpid()}\\); only one may run on a node"):
            PidFile(path).acquire()
        assert open(path).read() == f"{os.getpid()}\n"


def test_a_stale_file_from_a_killed_installer_is_reused(tmp_path):
    path = tmp_path / "toolkit.pid"
    path.write_text("999999\n")
    with PidFile(str(path)):
        assert path.read_text() == f"{os.getpid()}\n"


def test_a_second_installer_process_exits_with_a_one_line_error(tmp_path):
    path = str(tmp_path / "toolkit.pid")
    with PidFile(path):
        result = subprocess.run([NVCT, "toolkit", "install", "--pid-file", path, "--no-runtime-config",
                                 "--toolkit-install-dir", str(tmp_path / "install"), "--python", sys.executable,
                                 "--host-root", "/", "--driver-root", "/"],
                                capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (f"nvct: {path}: locked by another nvct toolkit install (pid {os.getpid()}); "
                             f"only one may run on a node\n")
    assert not (tmp_path / "install").exists()
