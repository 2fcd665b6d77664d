"""The shim's cdi mode: requests (env, volume mounts, annotations) -> edits -> OCI spec."""

from __future__ import annotations

import copy

import pytest

from nvct.base.errors import ConfigError, RequestError
from nvct.cdi import modes as cdi_modes
from nvct.config.file import Config
from nvct.edits.model import HOOK_ENV
from nvct.modifier import modes
from nvct.request import container as request

from .conftest import write_spec

NODE_SPEC = {
    "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [
            {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1, "permissions": "rw"}]}},
    ],
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}],
        "mounts": [{"hostPath": "/drv/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1",
                    "options": ["ro", "nosuid", "nodev", "bind"]}],
        "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvct", "args": ["nvct", "hook", "chain"]}],
    },
}


def _config(tmp_path, mode="cdi", **cdi) -> Config:
    cdi.setdefault("spec-dirs", [str(tmp_path / "etc"), str(tmp_path / "run")])
    return Config({"nvidia-container-runtime": {"mode": mode, "modes": {"cdi": cdi}},
                   "accept-nvidia-visible-devices-as-volume-mounts": True}, env={})


def _oci_spec(env=(), annotations=None, mounts=(), uid=0):
    return {
        "ociVersion": "1.0.2-dev",
        "process": {"user": {"uid": uid, "gid": uid}, "env": ["PATH=/bin", *env], "args": ["sh"]},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, *mounts],
        "annotations": annotations or {},
        "hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}]},
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }


@pytest.fixture
def cdi_dirs(tmp_path):
    write_spec(tmp_path / "etc", "nvidia.yaml", NODE_SPEC)
    return tmp_path


def _modify(tmp_path, oci, config=None):
    config = config or _config(tmp_path)
    req = request.from_spec(oci, config)
    result = modes.modify(oci, req, config)
    return result, oci


def test_a_qualified_name_in_the_env_injects_that_device(cdi_dirs):
    result, oci = _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"]))
    assert result.mode == "cdi"
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]
    assert oci["linux"]["resources"]["devices"][1:] == [
        {"allow": True, "type": "c", "major": 195, "minor": 255, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rw"},
    ]
    assert oci["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]
    assert oci["mounts"][-1] == {"destination": "/usr/lib/libcuda.so.1", "type": "bind",
                                 "source": "/drv/usr/lib/libcuda.so.1",
                                 "options": ["ro", "nosuid", "nodev", "bind"]}
    # the spec's nvct hook lacks env (a stale spec): it runs with the fixed one, never the container's
    assert oci["hooks"] == {"createContainer": [
        {"path": "/usr/bin/nvct", "args": ["nvct", "hook", "chain"], "env": list(HOOK_ENV)}]}


def test_another_vendors_hook_keeps_its_spec_env(tmp_path):
    spec = copy.deepcopy(NODE_SPEC)
    spec["containerEdits"]["hooks"] = [
        {"hookName": "createContainer", "path": "/opt/vendor/hook"},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook", "env": ["A=1"]}]
    write_spec(tmp_path / "etc", "nvidia.yaml", spec)
    _, oci = _modify(tmp_path, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"]))
    assert oci["hooks"]["createContainer"] == [{"path": "/opt/vendor/hook"},
                                               {"path": "/usr/bin/nvidia-cdi-hook", "env": ["A=1"]}]


def test_auto_mode_uses_cdi_when_every_device_is_a_cdi_name(cdi_dirs):
    result, oci = _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,nvidia.com/gpu=1"]),
                          _config(cdi_dirs, mode="auto"))
    assert (result.mode, result.why) == ("cdi", "auto: every requested device is a CDI name")
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]


@pytest.mark.parametrize("env, devices", [
    ("NVIDIA_VISIBLE_DEVICES=0", ["/dev/nvidiactl", "/dev/nvidia0"]),
    ("NVIDIA_VISIBLE_DEVICES=1,0", ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia0"]),
])
def test_unqualified_names_get_the_default_kind(cdi_dirs, env, devices):
    _, oci = _modify(cdi_dirs, _oci_spec([env]))
    assert [d["path"] for d in oci["linux"]["devices"]] == devices


def test_the_default_kind_is_configurable(cdi_dirs):
    other = copy.deepcopy(NODE_SPEC) | {"kind": "acme.com/accel"}
    write_spec(cdi_dirs / "run", "acme.json", other)
    _, oci = _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=1"]),
                     _config(cdi_dirs, **{"default-kind": "acme.com/accel"}))
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]


def test_an_invalid_default_kind_names_the_config_key(cdi_dirs):
    config = _config(cdi_dirs, **{"default-kind": "nvidia.com"})
    req = request.from_env({"NVIDIA_VISIBLE_DEVICES": "0"}, config)
    with pytest.raises(ConfigError, match="modes.cdi.default-kind: kind 'nvidia.com' is not of the form"):
        cdi_modes.edits_for(req, config)


def test_annotations_request_devices(cdi_dirs):
    oci = _oci_spec(annotations={"cdi.k8s.io/nvidia-device-plugin_0": "nvidia.com/gpu=0",
                                 "cdi.k8s.io/nvidia-device-plugin_1": "nvidia.com/gpu=1",
                                 "unrelated": "nvidia.com/gpu=7"})
    result, oci = _modify(cdi_dirs, oci)
    assert result.devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]


def test_annotation_prefixes_are_configurable(cdi_dirs):
    config = _config(cdi_dirs, **{"annotation-prefixes": ["example.com/cdi-"]})
    _, oci = _modify(cdi_dirs, _oci_spec(annotations={"example.com/cdi-x": "nvidia.com/gpu=1"}), config)
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1"]


def test_volume_mounts_request_devices(cdi_dirs):
    mounts = [{"destination": f"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/{i}",
               "source": "/dev/null", "type": "bind"} for i in (1, 0)]
    result, oci = _modify(cdi_dirs, _oci_spec(mounts=mounts))
    assert result.devices == ("nvidia.com/gpu=1", "nvidia.com/gpu=0")
    assert [d["path"] for d in oci["linux"]["devices"]] == ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia0"]


def test_an_undefined_device_fails_with_one_line_naming_the_dirs(cdi_dirs):
    with pytest.raises(RequestError) as info:
        _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=5"]))
    assert str(info.value) == (
        f"unresolvable CDI device nvidia.com/gpu=5; looked in {cdi_dirs}/etc, {cdi_dirs}/run (missing); "
        "found nvidia.com/gpu: 0, 1")


def test_none_asks_for_the_none_device(cdi_dirs):
    with pytest.raises(RequestError, match="unresolvable CDI device nvidia.com/gpu=none;"):
        _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=none"]))


def test_automatic_devices_cannot_be_mixed_with_others(cdi_dirs):
    config = _config(cdi_dirs)
    req = request.from_env({"NVIDIA_VISIBLE_DEVICES": "runtime.nvidia.com/gpu=0,nvidia.com/gpu=1"}, config)
    with pytest.raises(RequestError, match="runtime.nvidia.com/gpu cannot be requested together"):
        cdi_modes.edits_for(req, config)


def test_a_container_without_a_gpu_request_gets_nothing(cdi_dirs):
    config = _config(cdi_dirs)
    assert cdi_modes.edits_for(request.from_env({}, config), config).is_empty()


def test_device_nodes_belong_to_a_non_root_container_user(cdi_dirs):
    _, oci = _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"], uid=1000))
    assert {(d["path"], d.get("uid"), d.get("gid")) for d in oci["linux"]["devices"]} == \
        {("/dev/nvidiactl", 1000, 1000), ("/dev/nvidia0", 1000, 1000)}


def test_the_container_env_keeps_each_variable_once(cdi_dirs):
    _, oci = _modify(cdi_dirs, _oci_spec(["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "A=1"]))
    assert oci["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "A=1"]


def test_newer_cdi_edits_reach_the_oci_spec(tmp_path):
    write_spec(tmp_path / "etc", "rdt.json", {
        "cdiVersion": "1.1.0", "kind": "acme.com/nic",
        "devices": [{"name": "n0", "containerEdits": {
            "netDevices": [{"hostInterfaceName": "eth3", "name": "rdma0"}],
            "additionalGids": [0, 107],
            "deviceNodes": [{"path": "/dev/nic0", "type": "c", "major": 240, "minor": 0, "permissions": "none"}],
        }}],
        "containerEdits": {"intelRdt": {"closID": "gold", "l3CacheSchema": "L3:0=ff"}},
    })
    # Another vendor's device by env: privileged containers only (docs/security.md).
    spec = _oci_spec(["NVIDIA_VISIBLE_DEVICES=acme.com/nic=n0"])
    spec["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"]}
    _, oci = _modify(tmp_path, spec)
    assert oci["linux"]["netDevices"] == {"eth3": {"name": "rdma0"}}
    assert oci["linux"]["intelRdt"] == {"closID": "gold", "l3CacheSchema": "L3:0=ff"}
    assert oci["process"]["user"]["additionalGids"] == [107]
    assert oci["linux"]["resources"]["devices"][-1] == \
        {"allow": True, "type": "c", "major": 240, "minor": 0, "access": ""}
