"""Podman 4.3 with private configuration and storage.

``CONTAINERS_CONF`` replaces the system containers.conf and
``CONTAINERS_STORAGE_CONF`` the storage config, so nothing of the host's
podman state is read or written -- except CDI specs: podman 4.3 only reads
/etc/cdi and /var/run/cdi, hence :func:`cdi_spec`, which always removes
what it wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import tempfile
from typing import Iterator, Mapping, Sequence

import tomlkit
import yaml

from .proc import Result, minimal_env, pids_referencing, remove_tree, run, short_tempdir, stop_pid

PODMAN = "/usr/bin/podman"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


class Podman:
    """``with Podman() as p: p.load(tar); p.run(["--rm", "nvct/busybox", "echo", "hi"])``.

    ``runtime`` is the default OCI runtime (a name or a path); ``runtimes``
    adds ``[engine.runtimes]`` entries (name -> path) for ``--runtime NAME``;
    ``hooks_dirs`` sets ``[engine] hooks_dir``.
    """

    def __init__(self, *, runtime: str = "crun", runtimes: Mapping[str, str] | None = None,
                 hooks_dirs: Sequence[str] = (),
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.runtime = runtime
        self.runtimes = dict(runtimes or {})
        self.hooks_dirs = list(hooks_dirs)
        self.state_dir = short_tempdir("nvct-p-")  # conmon's sockets live under tmp_dir
        self.data_root = tempfile.mkdtemp(prefix="nvct-podman-data-")
        self.containers_conf = os.path.join(self.state_dir, "containers.conf")
        self.storage_conf = os.path.join(self.state_dir, "storage.conf")
        home = os.path.join(self.state_dir, "home")
        os.makedirs(home)
        self.env = minimal_env(home, extra={"CONTAINERS_CONF": self.containers_conf,
                                            "CONTAINERS_STORAGE_CONF": self.storage_conf,
                                            **(extra_env or {})})
        self._write_configs()

    def _write_configs(self) -> None:
        engine: dict = {
            "cgroup_manager": "cgroupfs",
            "events_logger": "file",
            "events_logfile_path": os.path.join(self.state_dir, "events.log"),
            "runtime": self.runtime,
            "tmp_dir": os.path.join(self.state_dir, "tmp"),
            "volume_path": os.path.join(self.data_root, "volumes"),
        }
        if self.hooks_dirs:
            engine["hooks_dir"] = self.hooks_dirs
        if self.runtimes:
            engine["runtimes"] = {name: [path] for name, path in self.runtimes.items()}
        conf = {
            "containers": {"default_ulimits": default_ulimits(), "netns": "none"},
            "engine": engine,
            "network": {"network_config_dir": os.path.join(self.state_dir, "net")},
        }
        storage = {"storage": {"driver": "overlay",
                               "graphroot": os.path.join(self.data_root, "graph"),
                               "runroot": os.path.join(self.state_dir, "run")}}
        with open(self.containers_conf, "w") as f:
            f.write(tomlkit.dumps(conf))
        with open(self.storage_conf, "w") as f:
            f.write(tomlkit.dumps(storage))

    def podman(self, args: Sequence[str], *, timeout: float = 120) -> Result:
        return run([PODMAN, *args], env=self.env, timeout=timeout)

    def load(self, image_tar: str | os.PathLike) -> Result:
        return self.podman(["load", "-q", "-i", os.fspath(image_tar)]).check()

    def run(self, args: Sequence[str], *, timeout: float = 120) -> Result:
        """``podman run ARGS`` (netns none comes from containers.conf)."""
        return self.podman(["run", *args], timeout=timeout)

    def cleanup(self) -> None:
        """Remove every container (``podman rm -af -t 0``)."""
        self.podman(["rm", "-af", "-t", "0"], timeout=120)

    def stop(self) -> None:
        try:
            self.cleanup()
        finally:
            # conmon of a container podman lost track of names our private dirs.
            for pid in pids_referencing(self.state_dir) + pids_referencing(self.data_root):
                stop_pid(pid, timeout=5)
            remove_tree(self.data_root)
            remove_tree(self.state_dir)

    def __enter__(self) -> "Podman":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def default_ulimits() -> list[str]:
    """Limits podman may set without CAP_SYS_RESOURCE: our own hard limits.

    podman 4.3 otherwise asks for RLIMIT_NOFILE 1048576 and a large NPROC,
    which fail where the hard limits are lower and cannot be raised.
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile == resource.RLIM_INFINITY:
        nofile = 1048576
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def unique_cdi_vendor() -> str:
    """A CDI vendor no other spec on the host uses: same-named devices conflict."""
    return f"nvct-test-{secrets.token_hex(4)}.example.com"


@contextlib.contextmanager
def cdi_spec(spec: Mapping | str, *, directory: str = CDI_DIRS[0],
             name: str | None = None, suffix: str = ".json") -> Iterator[str]:
    """Write a CDI spec where podman reads it; always remove it afterwards.

    ``spec`` is a dict (dumped as JSON, or YAML for ``.yaml``) or raw text.
    Podman 4.3 reads only ``*.json``/``*.yaml`` (not ``.yml``) and
    cdiVersion 0.2.0-0.5.0. Yields the file's path.
    """
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, (name or f"nvct-test-{secrets.token_hex(4)}") + suffix)
    if isinstance(spec, str):
        text = spec
    elif suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(dict(spec), sort_keys=False)
    else:
        text = json.dumps(spec, indent=2)
    with open(path, "x") as f:
        f.write(text)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def packaged_hooks_dir(directory: str | os.PathLike, hook: str, config: str) -> str:
    """``directory`` holding the repository's hooks/oci-nvidia-hook.json, its path set to
    ``hook`` and its env given ``NVIDIA_CTK_CONFIG_FILE_PATH=config``: podman's hooks_dir."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "hooks", "oci-nvidia-hook.json")) as f:
        entry = json.load(f)
    entry["hook"]["path"] = hook
    entry["hook"]["env"].append(f"NVIDIA_CTK_CONFIG_FILE_PATH={config}")
    with open(os.path.join(directory, "oci-nvidia-hook.json"), "w") as f:
        json.dump(entry, f)
    return os.fspath(directory)
