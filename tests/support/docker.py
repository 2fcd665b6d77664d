"""A private dockerd for end-to-end tests.

Its own config file, data root, exec root, pid file and socket; no bridge,
no iptables, so the host's network is untouched. It starts its own
containerd (under the exec root) unless one listens on the system socket.
Everything is stopped by recorded pid, never by process name.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import time
from typing import Mapping, Sequence

from .proc import (
    Result,
    daemon_dirs,
    minimal_env,
    pids_referencing,
    read_pidfile,
    remove_tree,
    run,
    start_daemon,
    stop_pid,
    wait_gone,
    wait_until,
)

DOCKERD = "/usr/sbin/dockerd"
#: Debian's 20.10 client; a newer /usr/local/bin/docker may shadow it on PATH.
DOCKER = "/usr/bin/docker"


@functools.lru_cache(maxsize=None)
def _writes_trust_key() -> bool:
    version = run([DOCKERD, "--version"], timeout=30).stdout  # "Docker version 20.10.24+dfsg1, ..."
    match = re.search(r"version (\d+)\.", version)
    return bool(match) and int(match.group(1)) < 23


class DockerdError(RuntimeError):
    """The private dockerd did not start (the message carries its log's tail)."""


class Dockerd:
    """``with Dockerd() as d: d.load(tar); d.run(["--rm", "nvct/busybox", "echo", "hi"])``.

    ``runtimes`` maps a name to a runtime path or to a daemon.json entry
    (``{"path": ..., "runtimeArgs": [...]}``). ``path_prefix`` directories
    come first on dockerd's PATH -- ``docker --gpus`` looks the NVIDIA hook up
    there, once, at start. ``extra_env`` is added to dockerd's fixed env.
    """

    def __init__(self, *, runtimes: Mapping[str, str | Mapping] | None = None,
                 default_runtime: str | None = None,
                 extra_env: Mapping[str, str] | None = None,
                 path_prefix: Sequence[str] = (), storage_driver: str = "overlay2",
                 extra_config: Mapping | None = None, wrapper: Sequence[str] = ()) -> None:
        self.wrapper = list(wrapper)  # argv dockerd runs under (e.g. a private mount namespace)
        self.runtimes = dict(runtimes or {})
        self.default_runtime = default_runtime
        self.storage_driver = storage_driver
        self.extra_config = dict(extra_config or {})
        home = daemon_dirs(self, "d", "dockerd", "daemon.json", path_prefix=path_prefix, extra_env=extra_env)
        self.socket = os.path.join(self.state_dir, "docker.sock")
        self.exec_root = os.path.join(self.state_dir, "exec")
        self.client_env = minimal_env(home, extra={
            "DOCKER_CONFIG": os.path.join(self.state_dir, "client")})
        self.pid: int | None = None
        self.containerd_pid: int | None = None
        self._proc: subprocess.Popen | None = None

    # -- lifecycle -------------------------------------------------------

    def start(self, timeout: float = 60) -> "Dockerd":
        """Start dockerd and wait until it answers; on failure nothing is left behind."""
        try:
            try:
                self._start(timeout)
            except DockerdError:
                if self.storage_driver != "overlay2" or "overlay" not in self.log_tail():
                    raise
                self._stop_daemon()
                self.storage_driver = "vfs"  # e.g. data root on overlayfs itself
                self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        self._write_config()
        self._proc = start_daemon(
            [*self.wrapper, DOCKERD, "--config-file", self.config_file, "--pidfile", self.pidfile,
             "--data-root", self.data_root, "--exec-root", self.exec_root,
             "-H", f"unix://{self.socket}"],
            env=self.env, log_path=self.log_path)
        self.pid = self._proc.pid
        deadline = time.monotonic() + timeout
        while not self.docker(["info"], timeout=10).ok:
            if self._proc.poll() is not None:
                raise DockerdError(f"dockerd exited with {self._proc.returncode}: "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise DockerdError(f"dockerd not ready after {timeout}s: {self.log_tail()}")
            time.sleep(0.1)
        self.containerd_pid = read_pidfile(
            os.path.join(self.exec_root, "containerd", "containerd.pid"))

    def stop(self) -> None:
        """Remove all containers, SIGTERM dockerd, wait for its containerd too."""
        try:
            if self._proc is not None and self._proc.poll() is None:
                ids = self.docker(["ps", "-aq"], timeout=30).stdout.split()
                if ids:
                    self.docker(["rm", "-f", *ids], timeout=60)
        finally:
            self._stop_daemon()
            remove_tree(self.data_root)
            remove_tree(self.state_dir)

    def _stop_daemon(self) -> None:
        if self._proc is not None:
            stop_pid(self._proc.pid, timeout=30)
            self._proc.wait()
            self._proc = None
        if self.containerd_pid is not None:
            if not wait_gone(self.containerd_pid, 15):
                stop_pid(self.containerd_pid)
            self.containerd_pid = None
        # Shims of containers that outlived their daemon name our private dirs.
        for pid in pids_referencing(self.state_dir) + pids_referencing(self.data_root):
            stop_pid(pid, timeout=5)

    def __enter__(self) -> "Dockerd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def reload(self, *, runtimes: Mapping[str, str | Mapping] | None = None,
               default_runtime: str | None = None, timeout: float = 20) -> None:
        """Rewrite daemon.json with new runtimes and SIGHUP dockerd; wait until applied."""
        removed = set(self.runtimes) - set(runtimes or {})
        self.runtimes = dict(runtimes or {})
        self.default_runtime = default_runtime
        self._write_config(always_runtimes=True)
        os.kill(self.pid, signal.SIGHUP)
        want_default = default_runtime or "runc"

        def applied() -> bool:
            info = self.docker(["info", "--format",
                                "{{json .Runtimes}} {{json .DefaultRuntime}}"], timeout=10)
            if not info.ok:
                return False
            names, _, default = info.stdout.strip().partition(" ")
            names = set(json.loads(names))
            return (set(self.runtimes) <= names and not removed & names
                    and json.loads(default) == want_default)

        if not wait_until(applied, timeout, 0.1):
            raise DockerdError(f"dockerd did not apply {self.config_file}: {self.log_tail()}")

    # -- client ----------------------------------------------------------

    def docker(self, args: Sequence[str], *, timeout: float = 120) -> Result:
        """``/usr/bin/docker -H unix://<sock> ARGS``."""
        return run([DOCKER, "-H", f"unix://{self.socket}", *args],
                   env=self.client_env, timeout=timeout)

    def load(self, image_tar: str | os.PathLike) -> Result:
        return self.docker(["load", "-i", os.fspath(image_tar)]).check()

    def run(self, args: Sequence[str], *, timeout: float = 120) -> Result:
        """``docker run --network none ARGS`` (e.g. ``["--rm", IMAGE, "echo", "hi"]``)."""
        return self.docker(["run", "--network", "none", *args], timeout=timeout)

    # -- internals -------------------------------------------------------

    def _write_config(self, always_runtimes: bool = False) -> None:
        config: dict = {
            "storage-driver": self.storage_driver,
            "bridge": "none",
            "iptables": False,
            "ip6tables": False,
            "ip-forward": False,
            "ip-masq": False,
        }
        if self.runtimes or always_runtimes:
            config["runtimes"] = {
                name: {"path": spec} if isinstance(spec, str) else dict(spec)
                for name, spec in self.runtimes.items()}
        if self.default_runtime or always_runtimes:
            # On reload an absent key keeps the old default; a default naming a
            # removed runtime makes dockerd 20.10 panic (nil runtime in info).
            config["default-runtime"] = self.default_runtime or "runc"
        if _writes_trust_key():
            # Else dockerd < 23 creates the host's /etc/docker/key.json.
            config["deprecated-key-path"] = os.path.join(self.state_dir, "key.json")
        config.update(self.extra_config)
        with open(self.config_file, "w") as f:
            json.dump(config, f, indent=2)

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return ""
