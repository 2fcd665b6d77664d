"""The launcher's front for ``apply-cuda-memory-limits``: no Python start where nothing is limited.

A generated CDI spec gives each GPU this createRuntime hook, so a container
given every GPU of a 64-GPU node would start Python 64 times for nothing. The
front exits 0 when the bundle's config.json names none of the variables the
hook reads (the build writes them into the launcher from nvct.edits.steps)
and holds no JSON escape; anything else reaches Python with the state intact.
A recording ``python3`` beside a copy of the launcher shows which way it went.
"""

from __future__ import annotations

import json
import os

import pytest

import nvct
from nvct.edits.steps import MEMORY_LIMIT, MEMORY_REQUEST
from nvct.programs.version import fill_launcher
from tests.support.proc import run

LAUNCHER = os.path.join(os.path.dirname(nvct.__file__), "scripts", "launcher")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def _program(tmp_path, name: str, *, filled: bool = True) -> tuple[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    text = open(LAUNCHER).read()
    program = bindir / name
    program.write_text(fill_launcher(text) if filled else text)
    program.chmod(0o755)
    record = tmp_path / "python-stdin"
    fake = bindir / "python3"
    fake.write_text(f'#!/bin/sh\necho "$@" > {record}.args\ncat > {record}\n')
    fake.chmod(0o755)
    return str(program), str(record)


def _bundle(tmp_path, env: list[str]) -> str:
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env], "args": ["true"]},
            "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(spec, separators=(",", ":")))
    return str(bundle)


def _state(bundle: str) -> str:
    return json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "created", "pid": 42, "bundle": bundle},
                      separators=(",", ":"))


HOOK = ["apply-cuda-memory-limits", "--driver-root", "/", "--gpu-id", "GPU-a"]
FORMS = {"nvidia-cdi-hook": HOOK, "nvidia-ctk": ["hook", *HOOK], "nvct": ["hook", *HOOK]}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_a_container_without_the_variables_starts_no_python(tmp_path, name):
    program, record = _program(tmp_path, name)
    result = run([program, *FORMS[name]], input=_state(_bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])), env=ENV)
    assert (result.rc, result.stderr) == (0, "")
    assert not os.path.exists(record)


@pytest.mark.parametrize("variable", MEMORY_REQUEST + MEMORY_LIMIT)
def test_each_variable_the_hook_reads_goes_to_python_with_the_state(tmp_path, variable):
    program, record = _program(tmp_path, "nvidia-cdi-hook")
    state = _state(_bundle(tmp_path, [f"{variable}=512"]))
    result = run([program, *HOOK], input=state, env=ENV)
    assert result.rc == 0, result.stderr
    assert open(record).read() == state
    assert open(record + ".args").read().split()[-len(HOOK):] == HOOK


@pytest.mark.parametrize("env", [["X=NVIDIA_GPU_MEMORY\\u005fLIMIT=1"], ["A=\\"]], ids=["escape", "backslash"])
def test_a_json_escape_that_could_spell_a_variable_goes_to_python(tmp_path, env):
    program, record = _program(tmp_path, "nvidia-cdi-hook")
    run([program, *HOOK], input=_state(_bundle(tmp_path, env)), env=ENV)
    assert os.path.exists(record)


def test_doubt_about_the_state_goes_to_python(tmp_path):
    program, record = _program(tmp_path, "nvidia-cdi-hook")
    bundle = _bundle(tmp_path, [])
    for state in ('{"bundle":"relative"}', _state(bundle) + '{"bundle":"/x"}', _state(bundle).replace("/", "\\/")):
        if os.path.exists(record):
            os.unlink(record)
        run([program, *HOOK], input=state, env=ENV)
        assert open(record).read() == state


def test_other_steps_and_an_unfilled_launcher_go_to_python(tmp_path):
    program, record = _program(tmp_path, "nvidia-cdi-hook")
    state = _state(_bundle(tmp_path, []))
    run([program, "create-symlinks", "--link", "a::b"], input=state, env=ENV)
    assert open(record).read() == state
    os.unlink(record)
    program, record = _program(tmp_path, "nvidia-ctk", filled=False)  # a checkout's: the build did not fill it
    run([program, "hook", *HOOK], input=state, env=ENV)
    assert open(record).read() == state
