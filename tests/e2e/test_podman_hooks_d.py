"""podman (runc and crun) running nvct's hooks.d hook, hooks/oci-nvidia-hook.json, on every start.

The hook's sh front exits without Python for a container that asks for no
GPU and hands anything else, with the OCI state podman gave it, to Python:
both ways are checked from inside real containers.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_root
from tests.support.podman import Podman, packaged_hooks_dir
from tests.support.runtimes import CRUN, RUNC

pytestmark = pytest.mark.containers

HOOK = os.path.join(os.path.dirname(sys.executable), "nvidia-container-runtime-hook")


@pytest.fixture(scope="module", params=["runc", "crun"])
def podman_with_hook(request, tmp_path_factory, sim_node, busybox_image_tar):
    """Podman whose hooks dir holds the packaged hook JSON, pointed at our hook and the node's config."""
    need_root()
    need_binaries("/usr/bin/podman", RUNC, CRUN)
    hooks = packaged_hooks_dir(tmp_path_factory.mktemp("hooks.d"), HOOK, sim_node["config"])
    with Podman(runtime={"runc": RUNC, "crun": CRUN}[request.param], hooks_dirs=[hooks]) as podman:
        podman.load(busybox_image_tar)
        yield podman


def test_gpu_request_reaches_python_and_the_container_sees_its_gpus(podman_with_hook, sim_node):
    result = podman_with_hook.run(["--rm", "-e", "NVIDIA_VISIBLE_DEVICES=1,3", BUSYBOX_IMAGE_QUALIFIED,
                                   "sh", "-c", "find /dev -type c -name 'nvidia[0-9]*' | sort; nvidia-smi -L"])
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    assert lines[:2] == ["/dev/nvidia1", "/dev/nvidia3"], result.describe()
    uuids = [sim_node["gpus"][i]["uuid"] for i in (1, 3)]
    assert lines[2:] == [f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {u})" for n, u in enumerate(uuids)]


def test_container_without_gpu_request_starts_with_nothing_injected(podman_with_hook):
    result = podman_with_hook.run(["--rm", BUSYBOX_IMAGE_QUALIFIED, "sh", "-c",
                                   "find /dev -name 'nvidia*' | wc -l; "
                                   "ls /usr/lib/x86_64-linux-gnu | grep -c nvidia; true"])
    assert result.rc == 0, result.describe()
    assert result.stdout.split() == ["0", "0"], result.describe()


def test_read_only_root_gets_its_gpu_through_the_prestart_hook(podman_with_hook):
    """``podman --read-only`` (readOnlyRootFilesystem): the prestart hook's work lands, the root stays read-only."""
    result = podman_with_hook.run(["--rm", "--read-only", "-e", "NVIDIA_VISIBLE_DEVICES=0", BUSYBOX_IMAGE_QUALIFIED,
                                   "sh", "-c", "ls /dev/nvidia0 && nvidia-smi -L | wc -l && "
                                   "(touch /written 2>/dev/null && echo writable || echo read-only)"])
    assert result.rc == 0, result.describe()
    assert result.stdout.split() == ["/dev/nvidia0", "1", "read-only"], result.describe()
