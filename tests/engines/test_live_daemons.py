"""Real dockerd and containerd read the configs ``nvct runtime configure`` writes.

The private daemons come from tests/support (own sockets, data and state
dirs, stopped by recorded pid); the subclasses here only let nvct edit the
config file before the daemon reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import tomlkit

from nvct.cli import main
from tests.engines import toml_loads
from tests.support.containerd import CONTAINERD, CTR, Containerd
from tests.support.docker import DOCKER, DOCKERD, Dockerd
from tests.support.proc import read_pidfile, wait_until

RUNC = "/usr/sbin/runc"
CRI = "io.containerd.grpc.v1.cri"


def _missing(*paths: str) -> list:
    return [p for p in paths if not os.access(p, os.X_OK)]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (starts dockerd/containerd)")
needs_docker = pytest.mark.skipif(bool(_missing(DOCKERD, DOCKER, RUNC)),
                                  reason=f"needs {', '.join(_missing(DOCKERD, DOCKER, RUNC))}")
needs_containerd = pytest.mark.skipif(bool(_missing(CONTAINERD, CTR, RUNC)),
                                      reason=f"needs {', '.join(_missing(CONTAINERD, CTR, RUNC))}")


def nvct(*args: str) -> None:
    assert main(["runtime", *args]) == 0


def configure_docker(path: str) -> None:
    nvct("configure", "--runtime", "docker", "--config", path, "--nvidia-runtime-path", RUNC,
         "--nvidia-runtime-name", "nvidia", "--set-as-default")


class NvctDockerd(Dockerd):
    """A private dockerd whose daemon.json nvct edited before it started."""

    def _write_config(self, always_runtimes: bool = False) -> None:
        super()._write_config(always_runtimes)
        configure_docker(self.config_file)


class NvctContainerd(Containerd):
    """A private containerd (v2 config) that nvct edited before it started."""

    def __init__(self, *, drop_in: bool, **kwargs):
        super().__init__(**kwargs)
        self.drop_in = drop_in

    def config(self):
        with open(self.config_file, "w") as f:
            f.write(tomlkit.dumps(super().config()))
        nvct("configure", "--runtime", "containerd", "--config", self.config_file,
             "--nvidia-runtime-path", RUNC, "--set-as-default",
             *([] if self.drop_in else ["--drop-in-config", ""]))
        with open(self.config_file) as f:
            return tomlkit.parse(f.read())  # start() dumps it back byte for byte


def _runtimes_and_default(d: Dockerd) -> tuple:
    out = d.docker(["info", "--format", "{{json .Runtimes}}\t{{json .DefaultRuntime}}"], timeout=30)
    assert out.ok, out.stderr
    names, default = out.stdout.strip().split("\t")
    return json.loads(names), json.loads(default)


@pytest.mark.containers
@needs_root
@needs_docker
def test_dockerd_starts_with_the_runtime_nvct_configured():
    with NvctDockerd() as d:
        runtimes, default = _runtimes_and_default(d)
        with open(d.config_file) as f:
            assert json.load(f)["runtimes"]["nvidia"] == {"path": RUNC, "runtimeArgs": []}
    assert runtimes["nvidia"] == {"path": RUNC}
    assert default == "nvidia"


@pytest.mark.containers
@needs_root
@needs_docker
def test_dockerd_runs_containers_with_the_nvct_runtime_as_default(busybox_image_tar):
    with NvctDockerd() as d:
        d.load(busybox_image_tar)
        result = d.run(["--rm", "nvct/busybox", "echo", "via-nvidia-runtime"])
    assert result.ok, result.stderr
    assert result.stdout.strip() == "via-nvidia-runtime"


@pytest.mark.containers
@needs_root
@needs_docker
def test_running_dockerd_reloads_the_runtime_on_sighup():
    with Dockerd() as d:
        before = open(d.config_file, "rb").read()
        configure_docker(d.config_file)
        pid = read_pidfile(d.pidfile)
        assert pid == d.pid
        os.kill(pid, signal.SIGHUP)
        assert wait_until(lambda: _runtimes_and_default(d) == ({"nvidia": {"path": RUNC}, "runc": {"path": "runc"}},
                                                               "nvidia"), 20, 0.1), d.log_tail()
        nvct("unconfigure", "--runtime", "docker", "--config", d.config_file)
        assert open(d.config_file, "rb").read() == before
        # No SIGHUP here: dockerd 20.10 keeps runtimes a reloaded file no longer
        # names (docs/runtime-configure.md); restart it after unconfigure.


@pytest.mark.containers
@needs_root
@needs_containerd
@pytest.mark.parametrize("drop_in", [False, True], ids=["plain", "drop-in"])
def test_containerd_loads_the_config_nvct_edited(drop_in):
    with NvctContainerd(drop_in=drop_in) as c:
        plugins = c.ctr(["plugins", "ls"], timeout=30)
        dump = subprocess.run([CONTAINERD, "--config", c.config_file, "config", "dump"],
                              capture_output=True, text=True, timeout=60)
        main_config = toml_loads(open(c.config_file).read())
    assert plugins.ok, plugins.stderr
    cri = [fields for fields in map(str.split, plugins.stdout.splitlines())
           if fields[:2] == ["io.containerd.grpc.v1", "cri"]]
    assert cri and cri[0][-1] == "ok", plugins.stdout
    assert dump.returncode == 0, dump.stderr
    effective = toml_loads(dump.stdout)["plugins"][CRI]
    assert effective["containerd"]["default_runtime_name"] == "nvidia"
    assert effective["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNC
    assert effective["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == RUNC  # not lost to the drop-in
    assert effective["restrict_oom_score_adj"] is True  # the rest of the CRI section survives the drop-in
    assert ("imports" in main_config) == drop_in


@needs_containerd
def test_command_source_reads_containerd_config_dump(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                      'SystemdCgroup = true\n')
    nvct("configure", "--runtime", "containerd", "--config", str(config), "--drop-in-config", "",
         "--config-source", "command", "--executable-path", CONTAINERD, "--nvidia-runtime-path", RUNC)
    nvidia = toml_loads(config.read_text())["plugins"][CRI]["containerd"]["runtimes"]["nvidia"]
    # Copied from the dump, which fills in every field containerd knows.
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert "privileged_without_host_devices" in nvidia
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": RUNC}


def _dump(config: str) -> dict:
    out = subprocess.run([CONTAINERD, "--config", config, "config", "dump"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return toml_loads(out.stdout)["plugins"][CRI]


@needs_containerd
def test_an_edit_of_the_main_config_after_configure_is_caught_by_doctor_and_kept_by_configure(tmp_path):
    from nvct import doctor

    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\nmax_container_log_line_size = 16384\n'
                      '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                      'runtime_type = "io.containerd.runc.v2"\n')
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    nvct("configure", "--runtime", "containerd", "--config", str(config), "--nvidia-runtime-path", RUNC)
    config.write_text(config.read_text().replace("16384", "65536"))  # the operator's later edit
    assert _dump(str(config))["max_container_log_line_size"] == 16384  # containerd 1.x: the drop-in's copy wins

    def drift():
        return [f for f in doctor.run(doctor.Options(containerd_config=str(config), docker_config=str(tmp_path / "x"),
                                                     crio_dir=str(tmp_path / "x"), cdi_dirs=(), env={}))
                if f.id == "runtime.containerd-drift"]

    [finding] = drift()
    assert (finding.status, finding.seen, finding.fix) == (
        "warn", f"{drop_in} sets 16384 for max_container_log_line_size, which {config} sets to 65536: containerd "
        f"uses the drop-in's copy, so edits of {config} made after nvct configured it are silently overridden",
        f"nvct runtime configure --runtime containerd --config {config} --drop-in-config {drop_in} "
        f"--nvidia-runtime-path {RUNC} (brings the copy up to date); then restart containerd")
    nvct("configure", "--runtime", "containerd", "--config", str(config), "--nvidia-runtime-path", RUNC)
    assert _dump(str(config))["max_container_log_line_size"] == 65536
    assert [f.status for f in drift()] == ["ok"]
    nvct("unconfigure", "--runtime", "containerd", "--config", str(config))
    # The backup stays, as unconfigure says: the operator changed the file since nvct first did.
    assert sorted(os.listdir(tmp_path)) == ["config.toml", "config.toml.nvct.bak"]
    assert "65536" in config.read_text() and "imports" not in config.read_text()
