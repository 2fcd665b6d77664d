"""Moving a spec's paths to another root."""

from __future__ import annotations

import copy

import pytest

from nvct.cdi.transform import transform_root
from nvct.edits.model import HOOK_ENV

ENV = list(HOOK_ENV)

SPEC = {
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
        {"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1", "hostPath": "/driver/dev/nvidia1"}]}}],
    "containerEdits": {
        "mounts": [
            {"hostPath": "/driver/usr/lib/libcuda.so.1", "containerPath": "/driver/usr/lib/libcuda.so.1"},
            {"hostPath": "/driver-old/usr/bin/x", "containerPath": "/usr/bin/x"},
            {"hostPath": "/driver", "containerPath": "/driver"},
        ],
        "hooks": [
            {"hookName": "createContainer", "path": "/driver/bin/nvct",
             "args": ["nvct", "hook", "create-symlinks", "--link", "/driver/a::/driver/b"], "env": ENV},
            {"hookName": "createRuntime", "path": "/driver/bin/nvct",
             "args": ["nvct", "/driver/lib", "--link", "/driver/a::/driver/b", "/other"], "env": ENV},
            {"hookName": "startContainer", "path": "/driver/bin/in-container", "args": ["/driver/x"], "env": ENV},
        ],
    },
}


def _transformed(relative_to, from_root="/driver", to_root="/host"):
    raw = copy.deepcopy(SPEC)
    transform_root(raw, from_root, to_root, relative_to)
    return raw


def test_host_relative_moves_host_side_paths():
    raw = _transformed("host")
    assert raw["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1", "hostPath": "/host/dev/nvidia1"}]
    assert [(m["hostPath"], m["containerPath"]) for m in raw["containerEdits"]["mounts"]] == [
        ("/host/usr/lib/libcuda.so.1", "/driver/usr/lib/libcuda.so.1"),
        ("/driver-old/usr/bin/x", "/usr/bin/x"),  # a prefix only at a component boundary
        ("/host", "/driver"),
    ]
    create, runtime, start = raw["containerEdits"]["hooks"]
    assert create == {"hookName": "createContainer", "path": "/host/bin/nvct",
                      "args": ["nvct", "hook", "create-symlinks", "--link", "/driver/a::/driver/b"], "env": ENV}
    assert runtime["path"] == "/host/bin/nvct"
    assert runtime["args"] == ["nvct", "/host/lib", "--link", "/host/a::/host/b", "/other"]
    assert start == SPEC["containerEdits"]["hooks"][2]


def test_container_relative_moves_container_side_paths():
    raw = _transformed("container", "/dev", "/devices")
    assert raw["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/devices/nvidia0", "hostPath": "/dev/nvidia0"},  # the host device stays
        {"path": "/devices/nvidia1", "hostPath": "/driver/dev/nvidia1"}]
    raw = _transformed("container")
    assert [m["containerPath"] for m in raw["containerEdits"]["mounts"]] == [
        "/host/usr/lib/libcuda.so.1", "/usr/bin/x", "/host"]
    create, runtime, start = raw["containerEdits"]["hooks"]
    assert create["path"] == "/driver/bin/nvct"
    assert create["args"][-1] == "/host/a::/host/b"
    assert runtime == SPEC["containerEdits"]["hooks"][1]
    assert start == {"hookName": "startContainer", "path": "/host/bin/in-container", "args": ["/host/x"], "env": ENV}


def test_from_the_root_directory_prefixes_every_host_path():
    raw = _transformed("host", "/", "/run/nvidia/driver")
    assert raw["devices"][0]["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}


@pytest.mark.parametrize("from_root, to_root", [("/driver", "/driver"), ("/driver/", "/driver")])
def test_same_roots_change_nothing(from_root, to_root):
    assert _transformed("host", from_root, to_root) == SPEC


def test_relative_to_must_be_host_or_container():
    with pytest.raises(ValueError, match="relative_to"):
        transform_root(copy.deepcopy(SPEC), "/a", "/b", "pod")


@pytest.mark.parametrize("relative_to", ["host", "container"])
def test_a_hook_without_env_comes_out_sealed(relative_to):
    """A stale spec's hook inherits a container's env under runc (CVE-2025-23266): never pass one on."""
    raw = copy.deepcopy(SPEC)
    for hook in raw["containerEdits"]["hooks"]:
        del hook["env"]
    raw["containerEdits"]["hooks"][1]["env"] = ["PATH=/opt/vendor/bin"]
    transform_root(raw, "/driver", "/driver", relative_to)
    assert [h["env"] for h in raw["containerEdits"]["hooks"]] == [ENV, ["PATH=/opt/vendor/bin"], ENV]


BIND_MOUNT = {"hookName": "createContainer", "path": "/driver/bin/nvct", "env": ENV, "args": [
    "nvct", "hook", "chain", "update-ldcache", "--folder", "/driver/lib", "--", "bind-mount",
    "--host-path", "/driver/tmp/nvidia-mps", "--container-path", "/driver/tmp/nvidia-mps",
    "--options", "nosuid,nodev,noexec,rbind,rprivate", "--", "bind-mount", "--host-path=/driver/x",
    "--container-path", "/driver/x"]}


@pytest.mark.parametrize("relative_to, host, container", [
    ("host", "/host", "/driver"), ("container", "/driver", "/host")])
def test_a_bind_mount_steps_source_is_a_host_path(relative_to, host, container):
    """The in-container hook mounts the MPS dir from the host: its --host-path moves with the host."""
    raw = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [],
           "containerEdits": {"hooks": [copy.deepcopy(BIND_MOUNT)]}}
    transform_root(raw, "/driver", "/host", relative_to)
    args = raw["containerEdits"]["hooks"][0]["args"]
    assert args[3:6] == ["update-ldcache", "--folder", f"{container}/lib"]
    assert args[8:12] == ["--host-path", f"{host}/tmp/nvidia-mps", "--container-path", f"{container}/tmp/nvidia-mps"]
    assert args[-3:] == [f"--host-path={host}/x", "--container-path", f"{container}/x"]
