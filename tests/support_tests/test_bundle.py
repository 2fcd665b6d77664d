from __future__ import annotations

import pytest

from tests.support.bundle import (
    DEFAULT_CAPS,
    DEFAULT_PATH,
    add_hook,
    edit_config,
    host_capabilities,
    make_bundle,
    read_config,
)


def test_bundle_is_non_interactive_with_args_env_and_default_caps(tmp_path):
    bundle = make_bundle(tmp_path / "b", tmp_path / "b" / "rootfs", ["echo", "hi"],
                         ["FOO=bar"])
    spec = read_config(bundle)
    assert spec["ociVersion"] == "1.0.2-dev"
    assert spec["process"]["terminal"] is False
    assert spec["process"]["args"] == ["echo", "hi"]
    assert spec["process"]["env"] == [DEFAULT_PATH, "FOO=bar"]
    assert spec["root"] == {"path": "rootfs", "readonly": False}
    assert spec["process"]["capabilities"]["bounding"] == list(DEFAULT_CAPS)
    assert "hooks" not in spec and "annotations" not in spec


def test_rootfs_outside_the_bundle_is_absolute(tmp_path):
    bundle = make_bundle(tmp_path / "b", tmp_path / "elsewhere", ["true"], readonly=True)
    assert read_config(bundle)["root"] == {"path": str(tmp_path / "elsewhere"),
                                           "readonly": True}


def test_path_in_env_replaces_the_default(tmp_path):
    bundle = make_bundle(tmp_path, tmp_path / "rootfs", ["true"], ["PATH=/x"])
    assert read_config(bundle)["process"]["env"] == ["PATH=/x"]


def test_privileged_grants_host_caps_devices_and_writable_sys(tmp_path):
    spec = read_config(make_bundle(tmp_path, tmp_path / "rootfs", ["true"], privileged=True))
    assert "CAP_SYS_ADMIN" in spec["process"]["capabilities"]["bounding"]
    assert spec["process"]["capabilities"]["bounding"] == host_capabilities()
    assert spec["process"]["noNewPrivileges"] is False
    assert spec["linux"]["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert spec["linux"]["maskedPaths"] == [] and spec["linux"]["readonlyPaths"] == []
    sys_mount = next(m for m in spec["mounts"] if m["destination"] == "/sys")
    assert "ro" not in sys_mount["options"]


def test_explicit_caps_mounts_annotations_and_hooks(tmp_path):
    mount = {"destination": "/data", "type": "bind", "source": "/tmp", "options": ["rbind"]}
    hook = {"path": "/bin/true"}
    spec = read_config(make_bundle(
        tmp_path, tmp_path / "rootfs", ["true"], caps=["CAP_MKNOD"], mounts=[mount],
        annotations={"a": "b"}, hooks={"prestart": [hook]}))
    assert spec["process"]["capabilities"]["effective"] == ["CAP_MKNOD"]
    assert spec["mounts"][-1] == mount
    assert spec["annotations"] == {"a": "b"}
    assert spec["hooks"] == {"prestart": [hook]}


def test_add_hook_appends_in_order_and_rejects_unknown_stages(tmp_path):
    bundle = make_bundle(tmp_path, tmp_path / "rootfs", ["true"])
    add_hook(bundle, "createContainer", "/h1", args=["h1", "x"], env=["A=1"], timeout=5)
    add_hook(bundle, "createContainer", "/h2")
    assert read_config(bundle)["hooks"]["createContainer"] == [
        {"path": "/h1", "args": ["h1", "x"], "env": ["A=1"], "timeout": 5}, {"path": "/h2"}]
    with pytest.raises(ValueError, match="prestartt"):
        add_hook(bundle, "prestartt", "/h")


def test_edit_config_writes_back(tmp_path):
    bundle = make_bundle(tmp_path, tmp_path / "rootfs", ["true"])
    with edit_config(bundle) as spec:
        spec["hostname"] = "edited"
    assert read_config(bundle)["hostname"] == "edited"
