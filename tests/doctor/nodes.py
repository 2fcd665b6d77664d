"""A healthy simulated GPU node with everything around it, for breaking one thing at a time.

``GpuNode(tmp_path)`` builds its own simulated node (tests break nodes, so
none is shared) and adds what a real host has besides the driver: the
``/dev/char`` links udev makes, the host's cgroup v1 mounts in
``proc/1/mountinfo``, docker, containerd and cri-o configs naming an NVIDIA
runtime, a fresh CDI spec, and nvct's config pointing at all of it.
Binaries the configs name are stub scripts in ``bin/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the simulated node's mknod)")

#: The host's cgroup mounts: hybrid, devices controller on v1.
MOUNTINFO_V1 = (
    "25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755\n"
    "30 25 0:26 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,devices\n"
    "31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:14 - cgroup2 cgroup2 rw\n"
)
#: A pure cgroup v2 host.
MOUNTINFO_V2 = "25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"

_DOCTOR_CHILD = ("import pickle, sys\nfrom nvct import doctor\n"
                 "sys.stdout.buffer.write(pickle.dumps(doctor.run(pickle.load(sys.stdin.buffer))))\n")

_STUBS = ("nvct", "nvidia-container-runtime", "nvidia-container-runtime-hook")


class GpuNode:
    """A simulated node at ``tmp_path/node`` plus engine configs, CDI spec and nvct config."""

    def __init__(self, tmp_path, *, mode: str = "auto", real: bool = False, **build_options):
        """``real``: nvct's config names the real programs (runc, nvct, the hook), so containers run."""
        from nvct.simulate import build_node

        self.real = real
        self.rebuilt = False
        self.tmp = str(tmp_path)
        self.dir = os.path.join(self.tmp, "node")
        self.manifest = build_node(self.dir, **build_options)
        self.version = self.manifest["driver_version"]
        self.bin = os.path.join(self.tmp, "bin")
        os.makedirs(self.bin)
        for name in _STUBS:
            write(os.path.join(self.bin, name), "#!/bin/sh\nexit 0\n", 0o755)
        self._char_links()
        write(os.path.join(self.dir, "proc/1/mountinfo"), MOUNTINFO_V1)
        self.cdi_dir = os.path.join(self.tmp, "cdi")
        self.config = os.path.join(self.tmp, "nvct.toml")
        self.write_config(mode=mode)
        self.docker_config = os.path.join(self.tmp, "docker/daemon.json")
        write(self.docker_config, json.dumps({"runtimes": {"nvidia": {
            "path": self.stub("nvidia-container-runtime"), "runtimeArgs": []}}}, indent=4))
        self.containerd_config = os.path.join(self.tmp, "containerd/config.toml")
        write(self.containerd_config, containerd_config({"runc": "/usr/sbin/runc",
                                                         "nvidia": self.stub("nvidia-container-runtime")}))
        self.crio_dir = os.path.join(self.tmp, "crio/crio.conf.d")
        write(os.path.join(self.crio_dir, "99-nvidia.toml"), crio_drop_in(self.stub("nvidia-container-runtime")))
        self.write_cdi_spec()

    def rebuild(self, **build_options) -> None:
        """The node simulated again in place (another topology, say), with what this class adds to it."""
        from nvct.simulate import build_node

        self.manifest = build_node(self.dir, **build_options)
        self.rebuilt = True
        self._char_links()
        write(os.path.join(self.dir, "proc/1/mountinfo"), MOUNTINFO_V1)

    def stub(self, name: str) -> str:
        return os.path.join(self.bin, name)

    def path(self, rel: str) -> str:
        return os.path.join(self.dir, rel.lstrip("/"))

    def write_config(self, *, mode: str = "auto", extra: str = "") -> None:
        q = json.dumps
        write(self.config, (
            f"[nvidia-container-cli]\nroot = {q(self.dir)}\n\n"
            f"[nvct]\ndev-root = {q(self.dir)}\nproc-root = {q(self.path('proc'))}\n"
            f"path = {q(self.program('nvct'))}\n\n"
            f"[nvidia-container-runtime]\nmode = {q(mode)}\nruntimes = [{q(self.program('runc'))}]\n{extra}\n"
            f"[nvidia-container-runtime.modes.cdi]\nspec-dirs = [{q(self.cdi_dir)}]\n\n"
            f"[nvidia-container-runtime-hook]\npath = {q(self.program('nvidia-container-runtime-hook'))}\n"))

    def program(self, name: str) -> str:
        """What the config names for ``name``: the real program, or a stub (runc: /bin/true)."""
        if name == "runc":
            return "/usr/sbin/runc" if self.real else "/bin/true"
        return os.path.join(os.path.dirname(sys.executable), name) if self.real else self.stub(name)

    def driver(self):
        from nvct.discover.driver import Driver

        return Driver(self.dir, self.dir, self.path("proc"))

    def write_cdi_spec(self, name: str = "nvidia.yaml", driver=None) -> str:
        from nvct.cdi import generate, spec

        raw = generate.generate(driver or self.driver(), hook_path=self.program("nvct"))
        return spec.save(raw, os.path.join(self.cdi_dir, name), "yaml")

    def options(self, **overrides):
        from nvct.doctor import Options

        values = dict(config_path=self.config, docker_config=self.docker_config,
                      docker_socket=os.path.join(self.tmp, "no-docker.sock"),
                      docker_pidfile=os.path.join(self.tmp, "no-docker.pid"),
                      containerd_config=self.containerd_config, crio_dir=self.crio_dir,
                      cdi_dirs=(self.cdi_dir,), default_path=f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin", env={})
        values.update(overrides)
        return Options(**values)

    def doctor(self, **overrides):
        from nvct import doctor

        options = self.options(**overrides)
        if not self.rebuilt:
            return doctor.run(options)
        # A library stays loaded under its path: this process would ask the first build's NVML.
        proc = subprocess.run([sys.executable, "-c", _DOCTOR_CHILD], input=pickle.dumps(options),
                              capture_output=True, check=True)
        return pickle.loads(proc.stdout)

    def cli_args(self) -> list[str]:
        """``nvct`` arguments for the same doctor run (without the default PATH, which has no flag)."""
        return ["--config", self.config, "doctor", "--docker-config", self.docker_config,
                "--docker-socket", os.path.join(self.tmp, "no-docker.sock"),
                "--docker-pidfile", os.path.join(self.tmp, "no-docker.pid"),
                "--containerd-config", self.containerd_config, "--crio-dir", self.crio_dir,
                "--cdi-dir", self.cdi_dir]

    def regenerate_ldcache(self) -> None:
        from nvct.simulate import ldcache

        ldcache.generate(self.dir)

    def _char_links(self) -> None:
        """``/dev/char/M:m -> ../<node>``, as udev makes them."""
        char = self.path("dev/char")
        os.makedirs(char)
        for node in self.manifest["device_nodes"]:
            os.symlink(os.path.relpath(self.path(node["path"]), char),
                       os.path.join(char, f"{node['major']}:{node['minor']}"))


def by_id(findings, id: str):
    return [f for f in findings if f.id == id]


def one(findings, id: str):
    """The single finding with ``id``."""
    found = by_id(findings, id)
    assert len(found) == 1, (id, found)
    return found[0]


def problems(findings):
    """Findings that are neither ok nor info."""
    return [f for f in findings if f.status not in ("ok", "info")]


def write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def containerd_config(runtimes: dict, *, version: int = 2) -> str:
    plugin = "io.containerd.grpc.v1.cri" if version == 2 else "io.containerd.cri.v1.runtime"
    text = f'version = {version}\n\n[plugins."{plugin}".containerd]\ndefault_runtime_name = "runc"\n'
    for name, binary in runtimes.items():
        text += (f'\n[plugins."{plugin}".containerd.runtimes.{name}]\nruntime_type = "io.containerd.runc.v2"\n'
                 f'[plugins."{plugin}".containerd.runtimes.{name}.options]\nBinaryName = {json.dumps(binary)}\n')
    return text


def crio_drop_in(binary: str, name: str = "nvidia") -> str:
    return (f'[crio.runtime.runtimes.{name}]\nruntime_path = {json.dumps(binary)}\n'
            f'runtime_type = "oci"\n')


@contextlib.contextmanager
def fake_dockerd(path_env: str):
    """A process listening on a unix socket with ``PATH=path_env``: what doctor sees of a dockerd.

    Yields (socket path, pid). The socket sits in a short private directory
    (unix socket paths are limited to 107 bytes).
    """
    directory = tempfile.mkdtemp(prefix="nvct-doc-")
    sock = os.path.join(directory, "docker.sock")
    script = ("import socket, sys\n"
              "s = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\n"
              "print('ready', flush=True)\n"
              "while True:\n    s.accept()[0].close()\n")
    proc = subprocess.Popen([sys.executable, "-c", script, sock], env={"PATH": path_env},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield sock, proc.pid
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def entry_point(name: str, tmp_dir: str) -> str:
    """An executable for nvct's console script ``name``: the installed one, else a wrapper."""
    installed = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(installed) and os.access(installed, os.X_OK):
        return installed
    target = {"nvct": "nvct.cli", "nvidia-container-runtime": "nvct.programs.shim",
              "nvidia-container-runtime-hook": "nvct.programs.hook"}[name]
    path = os.path.join(tmp_dir, name)
    write(path, f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {REPO!r})\n"
                f"from {target} import main\nsys.exit(main())\n", 0o755)
    return path


def clean_env(**extra) -> dict:
    """os.environ without nvct's overrides, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env.update(extra)
    return env
