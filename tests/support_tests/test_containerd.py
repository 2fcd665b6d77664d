from __future__ import annotations

import os

import pytest

from tests.support.containerd import CONTAINERD, CTR, Containerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, RUNC_HANDLER, need_binaries, need_root
from tests.support.proc import alive, pids_referencing
from tests.support.runtimes import RUNC

pytestmark = pytest.mark.containers


def test_ctr_run_with_runc_binary(private_containerd):
    result = private_containerd.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["echo", "hi"],
                                        runc_binary=RUNC)
    assert (result.rc, result.stdout) == (0, "hi\n"), result.describe()


def test_cri_pod_and_container_through_a_runtime_handler(private_containerd):
    result = private_containerd.cri_run(
        BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", "echo out; echo err >&2; exit 5"],
        runtime_handler=RUNC_HANDLER)
    assert (result.rc, result.stdout, result.stderr) == (5, "out\n", "err\n"), \
        result.describe()
    assert private_containerd.cri.list_pod_sandboxes() == []


def test_cri_reports_an_unknown_handler(private_containerd):
    result = private_containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["true"],
                                        runtime_handler="nvct-no-such-handler")
    assert result.rc == -1 and "nvct-no-such-handler" in result.stderr


def test_stop_kills_tasks_shims_and_containerd(busybox_image_tar):
    need_root()
    need_binaries(CONTAINERD, CTR, RUNC)
    containerd = Containerd()
    with containerd:
        containerd.import_image(busybox_image_tar)
        started = containerd.ctr(["run", "-d", BUSYBOX_IMAGE_QUALIFIED, "sleeper",
                                  "sleep", "600"])
        assert started.ok, started.describe()
        shims = pids_referencing(containerd.socket)
        assert shims and alive(containerd.pid)
    assert not alive(containerd.pid) and not any(alive(p) for p in shims)
    assert pids_referencing(containerd.state_dir) == []
    assert not os.path.exists(containerd.state_dir)
