"""A private containerd 1.6 (plus its CRI plugin) for end-to-end tests.

Own root, state and socket; several instances (and dockerd's own) coexist.
containerd has no ``--pidfile``, so a shell records its pid and execs it.
Shims outlive containerd: stopping kills every task in every namespace
first, then containerd by pid.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Mapping, Sequence

import tomlkit

from .cri import CriClient
from .image import ImageSpec, qualify
from .proc import (
    Result,
    daemon_dirs,
    pids_referencing,
    read_pidfile,
    remove_tree,
    run,
    start_daemon,
    stop_pid,
    unique_id,
)

CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
RUNC = "/usr/sbin/runc"
RUNC_V2 = "io.containerd.runc.v2"
#: The namespace the CRI plugin works in.
K8S_NAMESPACE = "k8s.io"
DEFAULT_SANDBOX_IMAGE = qualify(ImageSpec(name="nvct/pause").ref)
_CRI = "io.containerd.grpc.v1.cri"


class ContainerdError(RuntimeError):
    """The private containerd did not start (the message carries its log's tail)."""


class Containerd:
    """``with Containerd(runtimes={"runc2": "/usr/sbin/runc"}) as c: ...``.

    ``runtimes`` maps a CRI runtime handler name to a runtime binary
    (``BinaryName``) or to a dict: ``options`` goes to the runtime's
    ``options`` table, other keys (``pod_annotations``,
    ``container_annotations``, ``runtime_type``...) to the runtime's table.
    ``runc`` (the default handler) always exists.
    """

    def __init__(self, *, runtimes: Mapping[str, str | Mapping] | None = None,
                 default_runtime: str = "runc",
                 sandbox_image: str = DEFAULT_SANDBOX_IMAGE,
                 extra_env: Mapping[str, str] | None = None,
                 path_prefix: Sequence[str] = (), wrapper: Sequence[str] = ()) -> None:
        self.runtimes: dict = {"runc": RUNC, **(runtimes or {})}
        self.wrapper = list(wrapper)  # argv containerd and ctr run under (e.g. a node root's namespace)
        self.default_runtime = default_runtime
        self.sandbox_image = sandbox_image
        daemon_dirs(self, "c", "containerd", "config.toml", path_prefix=path_prefix, extra_env=extra_env)
        self.pod_logs = os.path.join(self.data_root, "pod-logs")
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._cri: CriClient | None = None

    # -- lifecycle -------------------------------------------------------

    def start(self, timeout: float = 60) -> "Containerd":
        """Start containerd and wait until it answers; on failure nothing is left behind."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        with open(self.config_file, "w") as f:
            f.write(tomlkit.dumps(self.config()))
        self._proc = start_daemon(
            [*self.wrapper, "/bin/sh", "-c", 'echo $$ > "$1"; exec "$2" --config "$3"', "sh",
             self.pidfile, CONTAINERD, self.config_file],
            env=self.env, log_path=self.log_path)
        deadline = time.monotonic() + timeout
        while not self.ctr(["version"], timeout=10).ok:
            if self._proc.poll() is not None:
                raise ContainerdError(f"containerd exited with {self._proc.returncode}: "
                                      f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ContainerdError(f"containerd not ready after {timeout}s: "
                                      f"{self.log_tail()}")
            time.sleep(0.05)
        self.pid = read_pidfile(self.pidfile)
        if self.pid != self._proc.pid:
            raise ContainerdError(f"{self.pidfile} holds {self.pid}, not {self._proc.pid}")

    def stop(self) -> None:
        """Kill and delete every task and container, then containerd itself."""
        try:
            if self._cri is not None:
                self._cri.close()
                self._cri = None
            if self._proc is not None and self._proc.poll() is None:
                self._remove_everything()
        finally:
            if self._proc is not None:
                stop_pid(self._proc.pid, timeout=20)
                self._proc.wait()
                self._proc = None
            for pid in pids_referencing(self.state_dir) + pids_referencing(self.data_root):
                stop_pid(pid, timeout=5)  # shims: their -address names our socket
            remove_tree(self.data_root)
            remove_tree(self.state_dir)

    def _remove_everything(self) -> None:
        for ns in self.ctr(["namespaces", "ls", "-q"], timeout=30).stdout.split():
            for task in self.ctr(["tasks", "ls", "-q"], namespace=ns, timeout=30).stdout.split():
                self.ctr(["tasks", "kill", "-s", "SIGKILL", task], namespace=ns, timeout=30)
                self.ctr(["tasks", "delete", "--force", task], namespace=ns, timeout=30)
            ids = self.ctr(["containers", "ls", "-q"], namespace=ns, timeout=30).stdout.split()
            if ids:
                self.ctr(["containers", "rm", *ids], namespace=ns, timeout=60)

    def __enter__(self) -> "Containerd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def config(self) -> dict:
        """config.toml (version 2) as a dict."""
        runtimes = {}
        for name, spec in self.runtimes.items():
            spec = {"options": {"BinaryName": spec}} if isinstance(spec, str) else dict(spec)
            table = {"runtime_type": RUNC_V2}
            table.update({k: v for k, v in spec.items() if k != "options"})
            table["options"] = dict(spec.get("options", {}))
            runtimes[name] = table
        return {
            "version": 2,
            "root": os.path.join(self.data_root, "root"),
            "state": os.path.join(self.state_dir, "state"),
            "grpc": {"address": self.socket},
            "plugins": {
                "io.containerd.internal.v1.opt": {"path": os.path.join(self.data_root, "opt")},
                _CRI: {
                    "sandbox_image": self.sandbox_image,
                    "enable_selinux": False,
                    # No CAP_SYS_RESOURCE here: the pause's -998 would fail in runc.
                    "restrict_oom_score_adj": True,
                    "containerd": {"default_runtime_name": self.default_runtime,
                                   "runtimes": runtimes},
                    "cni": {"bin_dir": os.path.join(self.data_root, "cni-bin"),
                            "conf_dir": os.path.join(self.state_dir, "cni")},
                },
            },
        }

    # -- clients ---------------------------------------------------------

    def ctr(self, args: Sequence[str], *, namespace: str | None = None,
            timeout: float = 120) -> Result:
        """``ctr --address <sock> [-n NS] ARGS``."""
        ns = ["-n", namespace] if namespace else []
        return run([*self.wrapper, CTR, "--address", self.socket, *ns, *args], env=self.env, timeout=timeout)

    def import_image(self, image_tar: str | os.PathLike, namespace: str = "default") -> Result:
        return self.ctr(["images", "import", os.fspath(image_tar)],
                        namespace=namespace).check()

    def ctr_run(self, image: str, args: Sequence[str], *, namespace: str = "default",
                runc_binary: str | None = None, container_id: str | None = None,
                extra_args: Sequence[str] = (), timeout: float = 120) -> Result:
        """``ctr run --rm [--runc-binary B] EXTRA IMAGE ID ARGS`` (``image`` fully qualified)."""
        opts = ["--runc-binary", runc_binary] if runc_binary else []
        cid = container_id or unique_id()
        result = self.ctr(["run", "--rm", *opts, *extra_args, image, cid, *args],
                          namespace=namespace, timeout=timeout)
        if not result.ok:  # a failed create/start can leave the container record behind
            self.ctr(["tasks", "delete", "--force", cid], namespace=namespace, timeout=30)
            self.ctr(["containers", "rm", cid], namespace=namespace, timeout=30)
        return result

    @property
    def cri(self) -> CriClient:
        """A CRI client on this containerd, ready to use."""
        if self._cri is None:
            self._cri = CriClient(self.socket)
            self._cri.wait_ready()
        return self._cri

    def cri_run(self, image: str, command: Sequence[str], **kwargs) -> Result:
        """One pod + container via CRI (see :meth:`CriClient.run_once`)."""
        kwargs.setdefault("log_directory", os.path.join(self.pod_logs, unique_id("logs")))
        return self.cri.run_once(image, command, **kwargs)

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return ""
