"""Sandbox specs and edits: no hooks, no /proc mounts, each library under its link names where the loader looks.

Containers that run them (user namespaces through runc, crun and podman) are
in tests/e2e/test_userns_sandbox.py.
"""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import NvctError
from nvct.cdi import generate
from nvct.config import keys as configkeys
from nvct.config.file import Config
from nvct.edits import sandbox

from .conftest import node_driver

HOOK = "/opt/nvct/bin/nvct"


@pytest.fixture(scope="module")
def spec(node) -> dict:
    return generate.generate(node_driver(node), hook_path=HOOK, mode="sandbox")


def _mounts(raw) -> list[dict]:
    out = list(raw["containerEdits"].get("mounts", []))
    for device in raw["devices"]:
        out += device["containerEdits"].get("mounts", [])
    return out


def test_the_spec_has_no_hook_and_nothing_under_proc(spec):
    assert "hooks" not in spec["containerEdits"]
    assert all("hooks" not in d["containerEdits"] for d in spec["devices"])
    assert not [m for m in _mounts(spec) if m["containerPath"].startswith("/proc")]


def test_the_spec_has_the_gpus_as_the_default_mode(node, spec):
    default = generate.generate(node_driver(node), hook_path=HOOK)
    for device in default["devices"]:  # less each GPU's memory limits hook: a hook
        device["containerEdits"].pop("hooks", None)
    assert [d["name"] for d in spec["devices"]] == [d["name"] for d in default["devices"]]
    assert spec["devices"] == default["devices"]
    assert spec["cdiVersion"] == "0.5.0"  # podman 4.3 reads it


@pytest.mark.parametrize("name", ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so",
                                  "libnvidia-ptxjitcompiler.so.1", "libGLX_indirect.so.0"])
@pytest.mark.parametrize("directory", ["/usr/lib/x86_64-linux-gnu", "/usr/lib64"])
def test_each_library_is_mounted_under_its_link_names_in_both_loader_dirs(spec, name, directory):
    """Debian's and RHEL's loaders search these without an ld cache entry: the real file, not a link."""
    found = [m for m in _mounts(spec) if m["containerPath"] == f"{directory}/{name}"]
    assert len(found) == 1, name
    real = os.path.basename(found[0]["hostPath"])
    assert real != name and ".so." in real and os.path.isfile(found[0]["hostPath"])
    assert "ro" in found[0]["options"]


def test_no_container_path_twice(spec):
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert len(paths) == len(set(paths))


def test_no_writable_mount(spec):
    """The MPS pipe dir is mounted by nvct's hook only (docs/cdi.md): a sandbox spec leaves it out."""
    assert all("ro" in m["options"] for m in _mounts(spec))


def test_the_hooked_spec_is_unchanged(node):
    """The default mode still has its hook and no loader-dir mounts."""
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    assert raw["containerEdits"]["hooks"]
    assert not [m for m in raw["containerEdits"]["mounts"] if m["containerPath"].startswith("/usr/lib64/")]


def test_loader_dirs_by_architecture():
    assert sandbox.loader_dirs("x86_64") == ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")
    assert sandbox.loader_dirs("aarch64") == ("/usr/lib/aarch64-linux-gnu", "/usr/lib64")


def test_the_none_device(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, mode="sandbox", device_ids=("none",))
    assert [d["name"] for d in raw["devices"]] == ["none"]


@pytest.mark.parametrize("config, annotations, want", [
    ({}, {}, False),
    ({}, {sandbox.ANNOTATION: "true"}, True),
    ({}, {sandbox.ANNOTATION: "false"}, False),
    ({"nvct": {"sandbox": "always"}}, {}, True),
    ({"nvct": {"sandbox": "never"}}, {sandbox.ANNOTATION: "true"}, False),
    ({"nvct": {"sandbox": "annotation"}}, {sandbox.ANNOTATION: "true"}, True),
])
def test_jit_cdi_selection(config, annotations, want):
    assert sandbox.wanted({"annotations": annotations}, Config(config))[0] is want


@pytest.mark.parametrize("config, annotations, message", [
    ({"nvct": {"sandbox": "yes"}}, {}, "nvct.sandbox: 'yes' is not one of annotation, always, never"),
    ({"nvct": {"sandbox": True}}, {}, "nvct.sandbox: True is not one of annotation, always, never"),
    ({}, {sandbox.ANNOTATION: "1"}, "annotation nvct/sandbox: '1' is not true or false"),
])
def test_bad_selection_is_one_line(config, annotations, message):
    with pytest.raises(NvctError) as e:
        sandbox.wanted({"annotations": annotations}, Config(config))
    assert str(e.value) == message


def test_the_config_key_is_known():
    assert configkeys.unknown({"nvct": {"sandbox": "always"}}) == []


def test_explain_names_the_choice_and_shows_no_hook(node):
    from nvct.doctor import explain

    from .conftest import node_config

    config = node_config(node, {"nvidia-container-runtime": {"mode": "jit-cdi"}})
    spec = explain.spec_from_options(["NVIDIA_VISIBLE_DEVICES=0"], annotations=[f"{sandbox.ANNOTATION}=true"])
    result = explain.explain(spec, config, driver=node_driver(node))
    assert result.error is None or not result.error, result.error
    assert result.why.endswith(f"; sandbox edits, no hooks (annotation {sandbox.ANNOTATION}=true)")
    assert not result.edits.hooks
    assert "/usr/lib64/libcuda.so.1" in {m.container_path for m in result.edits.mounts}
