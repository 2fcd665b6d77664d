from __future__ import annotations

import os

import pytest

from tests.support import cgroupfix
from tests.support.docker import DOCKER, DOCKERD, Dockerd, DockerdError
from tests.support.fixtures import BUSYBOX_IMAGE, need_binaries, need_root
from tests.support.proc import alive, pids_referencing
from tests.support.runtimes import CRUN, RUNC

pytestmark = pytest.mark.containers


def test_private_dockerd_runs_a_container_and_leaves_nothing(busybox_image_tar, tmp_path):
    need_root()
    need_binaries(DOCKERD, DOCKER, RUNC)
    # `docker --gpus` finds the hook on dockerd's PATH at start: prove path_prefix.
    hook_dir = tmp_path / "bin"
    hook_dir.mkdir()
    hook = hook_dir / "nvidia-container-runtime-hook"
    hook.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/hook-args\n')
    hook.chmod(0o755)
    dockerd = Dockerd(path_prefix=[str(hook_dir)], extra_env={"NVCT_MARK": "1"})
    with dockerd:
        assert os.path.exists(dockerd.socket) and len(dockerd.socket) < 108
        assert dockerd.env["NVCT_MARK"] == "1"
        dockerd.load(busybox_image_tar)
        result = dockerd.run(["--rm", BUSYBOX_IMAGE, "echo", "hi"])
        assert (result.rc, result.stdout, result.stderr) == (0, "hi\n", ""), result.describe()
        gpus = dockerd.run(["--rm", "--gpus", "all", BUSYBOX_IMAGE, "true"])
        assert gpus.ok, gpus.describe()
        assert (tmp_path / "hook-args").read_text() == "prestart\n"
        detached = dockerd.docker(["run", "-d", "--network", "none", BUSYBOX_IMAGE,
                                   "sleep", "600"])
        assert detached.ok, detached.describe()
        daemon_pids = [dockerd.pid, dockerd.containerd_pid]
        assert all(daemon_pids) and all(alive(p) for p in daemon_pids)
    assert not any(alive(p) for p in daemon_pids)
    assert pids_referencing(dockerd.state_dir) == []
    assert not os.path.exists(dockerd.state_dir) and not os.path.exists(dockerd.data_root)


def test_reload_applies_new_runtimes(private_dockerd):
    need_binaries(CRUN)
    cgroupfix.ensure_crun_works()
    private_dockerd.reload(runtimes={"crun": CRUN}, default_runtime="crun")
    try:
        info = private_dockerd.docker(["info", "--format", "{{.DefaultRuntime}}"])
        assert info.stdout.strip() == "crun"
        result = private_dockerd.run(["--rm", BUSYBOX_IMAGE, "cat", "/proc/1/comm"])
        assert (result.rc, result.stdout) == (0, "cat\n"), result.describe()
    finally:
        private_dockerd.reload()


def test_docker_error_comes_back_on_stderr(private_dockerd):
    result = private_dockerd.run(["--rm", BUSYBOX_IMAGE, "/nonexistent"])
    assert result.rc != 0 and "/nonexistent" in result.stderr


def test_failed_start_raises_with_the_log_and_cleans_up():
    need_root()
    need_binaries(DOCKERD, DOCKER)
    dockerd = Dockerd(extra_config={"nvct-no-such-option": True})
    with pytest.raises(DockerdError, match="nvct-no-such-option"):
        dockerd.start(timeout=20)
    assert not os.path.exists(dockerd.state_dir) and not os.path.exists(dockerd.data_root)
