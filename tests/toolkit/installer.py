"""``nvct toolkit install`` as a background process, the way a DaemonSet runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from nvct.toolkit import READY_MESSAGE
from tests.support.proc import wait_until

VENV_BIN = os.path.dirname(sys.executable)
NVCT = os.path.join(VENV_BIN, "nvct")


def node_flags(manifest: dict) -> list:
    """The installer's roots for a simulated node: its driver, dev and proc roots."""
    roots = manifest["roots"]
    return ["--driver-root", roots["driver_root"], "--dev-root", roots["dev_root"],
            "--proc-root", roots["proc_root"]]


class Installer:
    """``with Installer([...flags], tmp) as inst: ...`` starts it and waits until it is ready."""

    def __init__(self, args: list, workdir: str, *, env: dict | None = None, program: list | None = None):
        """``program`` replaces ``nvct toolkit install`` and its directory flags (an entry program
        configured by environment variables alone, as the GPU Operator runs it)."""
        self.workdir = str(workdir)
        self.install_dir = os.path.join(self.workdir, "install")
        self.toolkit = os.path.join(self.install_dir, "toolkit")
        self.pid_file = os.path.join(self.workdir, "run", "toolkit.pid")
        self.log_path = os.path.join(self.workdir, "installer.log")
        self.argv = [*program, *args] if program else [
            NVCT, "toolkit", "install", "--toolkit-install-dir", self.install_dir,
            "--pid-file", self.pid_file, "--host-root", "/", *args]
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.ready_after: float | None = None

    def start(self, timeout: float = 90) -> "Installer":
        start = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_until(lambda: READY_MESSAGE in self.log() or self.proc.poll() is not None, timeout):
            self.kill()
            raise AssertionError(f"the installer was not ready after {timeout}s: {self.log()}")
        if READY_MESSAGE not in self.log():
            raise AssertionError(f"the installer exited with {self.proc.returncode}: {self.log()}")
        self.ready_after = time.monotonic() - start
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90) -> int:
        """Signal it and wait: its exit status."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the installer did not stop within {timeout}s: {self.log()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "Installer":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
