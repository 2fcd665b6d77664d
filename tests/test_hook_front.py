"""The sh front of ``nvidia-container-runtime-hook``: no Python start for a container without a GPU.

podman and cri-o run the packaged hooks.d hook on every container start. The
front execs Python whenever the bundle's config.json might ask for a GPU, or
when anything is unusual; these tests put a recording ``python3`` beside a
copy of the script (the front prefers a virtualenv's) to see which way it went
and what Python was given on stdin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import nvct

SCRIPT = os.path.join(os.path.dirname(nvct.__file__), "scripts", "nvidia-container-runtime-hook")
HOOKS_D_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


@pytest.fixture
def front(tmp_path):
    """(hook path, file where the fake python3 records its stdin)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    hook = bindir / "nvidia-container-runtime-hook"
    shutil.copy(SCRIPT, hook)
    record = tmp_path / "python-stdin"
    fake = bindir / "python3"
    fake.write_text(f"#!/bin/sh\ncat > {record}\n")
    fake.chmod(0o755)
    return str(hook), record


def _bundle(tmp_path, env=(), annotations=None):
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env], "args": ["true"]},
            "root": {"path": "rootfs"}, "annotations": annotations or {}}
    (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))
    return str(bundle)


def _state(bundle, **extra):
    return json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 42,
                       "bundle": bundle, **extra}, separators=(",", ":"))


def _run(hook, state, env=None, args=("prestart",)):
    return subprocess.run([hook, *args], input=state, capture_output=True, text=True,
                          env=env or HOOKS_D_ENV, cwd="/", timeout=30)


def test_no_gpu_request_exits_0_without_python(front, tmp_path):
    hook, record = front
    result = _run(hook, _state(_bundle(tmp_path)))
    assert result.returncode == 0 and result.stderr == ""
    assert not record.exists()


@pytest.mark.parametrize("env, annotations", [
    (["NVIDIA_VISIBLE_DEVICES=all"], None),
    (["CUDA_VERSION=12.4"], None),
    ([], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
    (["X=\\u004eVIDIA_VISIBLE_DEVICES"], None),  # a JSON escape: only Python can tell
])
def test_a_possible_gpu_request_goes_to_python_with_the_whole_state(front, tmp_path, env, annotations):
    hook, record = front
    state = _state(_bundle(tmp_path, env, annotations))
    assert _run(hook, state).returncode == 0
    assert record.read_text() == state


def test_device_list_mount_goes_to_python(front, tmp_path):
    hook, record = front
    bundle = _bundle(tmp_path)
    spec = json.loads(open(os.path.join(bundle, "config.json")).read())
    spec["mounts"] = [{"destination": "/var/run/nvidia-container-devices/all", "source": "/dev/null"}]
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f)
    _run(hook, _state(bundle))
    assert record.exists()


@pytest.mark.parametrize("state", [
    lambda b: _state(b, annotations={"k": "say \"bundle\":\"/elsewhere\""}),  # escapes in the state
    lambda b: _state(b) + "\n" + _state("/elsewhere"),  # two states, two lines
    lambda b: '{"bundlePath":"%s","pid":42}' % b,  # the old key
    lambda b: '{"bundle": "%s", "pid": 42}' % b,  # spaces: not the runtimes' compact form
    lambda b: "",
])
def test_unusual_state_goes_to_python_unchanged(front, tmp_path, state):
    hook, record = front
    text = state(_bundle(tmp_path))
    _run(hook, text)
    assert record.read_text() == text


@pytest.mark.parametrize("key", ["swarm-resource", "nvidia-container-runtime.modes.cdi.annotation-prefixes"])
def test_a_config_that_adds_request_names_goes_to_python(front, tmp_path, key):
    hook, record = front
    config = tmp_path / "config.toml"
    config.write_text(f'{key} = "DOCKER_RESOURCE_GPU"\n')
    _run(hook, _state(_bundle(tmp_path)), env=dict(HOOKS_D_ENV, NVIDIA_CTK_CONFIG_FILE_PATH=str(config)))
    assert record.exists()


def test_a_commented_out_key_does_not_count(front, tmp_path):
    hook, record = front
    config = tmp_path / "config.toml"
    config.write_text('#swarm-resource = "DOCKER_RESOURCE_GPU"\n')
    _run(hook, _state(_bundle(tmp_path)), env=dict(HOOKS_D_ENV, NVIDIA_CTK_CONFIG_FILE_PATH=str(config)))
    assert not record.exists()


@pytest.mark.parametrize("env", [{"LD_LIBRARY_PATH": "/opt/lib"}, {"LD_PRELOAD": ""}])
def test_loader_variables_leave_the_decision_to_python(front, tmp_path, env):
    hook, record = front
    _run(hook, _state(_bundle(tmp_path)), env=dict(HOOKS_D_ENV, **env))
    assert record.exists()


def test_the_legacy_shims_mark_goes_to_python_with_stdin_untouched(front, tmp_path):
    """nvct's legacy shim saw the GPU request and says so in the hook's env: no greps, no copy."""
    hook, record = front
    state = _state(_bundle(tmp_path))
    _run(hook, state, env=dict(HOOKS_D_ENV, NVCT_GPU_REQUEST="1"))
    assert record.read_text() == state


@pytest.mark.parametrize("args", [("poststart",), ("--config", "/x", "prestart"), ("--version",)])
def test_other_command_lines_go_to_python(front, tmp_path, args):
    hook, record = front
    _run(hook, _state(_bundle(tmp_path)), args=args)
    assert record.exists()


def test_missing_bundle_config_goes_to_python(front, tmp_path):
    hook, record = front
    _run(hook, _state(str(tmp_path / "nowhere")))
    assert record.exists()
