"""The sh front of ``nvidia-container-runtime-hook``: no Python start for a container without a GPU.

podman and cri-o run the packaged hooks.d hook on every container start. The
front execs Python whenever the bundle's config.json might ask for a GPU, or
when anything is unusual; these tests put a recording ``python3`` beside a
copy of the script (the front prefers a virtualenv's) to see which way it went
and what Python was given on stdin. The strings the front greps for are the
ones the hook's Python recorded for the config (nvct.oci.runtime): each test has
them recorded by the real hook, in a mount namespace with a /run of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import nvct
from tests.support.fixtures import need_root
from tests.support.legacy_front import age, request_specs, write_spec

SCRIPT = os.path.join(os.path.dirname(nvct.__file__), "scripts", "nvidia-container-runtime-hook")
REAL_HOOK = os.path.join(os.path.dirname(sys.executable), "nvidia-container-runtime-hook")
HOOKS_D_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(REPO, "config", "config.toml")
REFERENCE = os.path.join(REPO, "tests", "perf", "reference-config.toml")


class HookFront:
    """A copy of the front with a recording python3, a config, and a private /run where the real
    hook's Python recorded that config."""

    def __init__(self, directory, config_text: str):
        need_root("the record in /run/nvct is root-only")
        bindir = directory / "bin"
        bindir.mkdir()
        self.hook = str(bindir / "nvidia-container-runtime-hook")
        shutil.copy(SCRIPT, self.hook)
        self.record = directory / "python-stdin"
        fake = bindir / "python3"
        fake.write_text(f"#!/bin/sh\ncat > {self.record}\n")
        fake.chmod(0o755)
        self.run_dir = str(directory / "run")
        os.makedirs(self.run_dir)
        self.config = str(directory / "config.toml")
        self.write_config(config_text)
        self.env = dict(HOOKS_D_ENV, NVIDIA_CTK_CONFIG_FILE_PATH=self.config)
        self.bundle = _bundle(directory / "primer")
        self.remember()

    def write_config(self, text):
        with open(self.config, "w") as f:
            f.write(text)
        age(self.config)

    def private(self, argv):
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /run && exec "$@"',
                self.run_dir, *argv]

    def remember(self):
        """The real hook, on a spec without a request, until its record of the config is trusted."""
        for _ in range(20):
            r = subprocess.run(self.private([REAL_HOOK, "prestart"]), input=_state(self.bundle), text=True,
                               env=self.env, capture_output=True, timeout=60)
            assert r.returncode == 0, r.stderr
            with open(os.path.join(self.run_dir, "nvct", "runtimes")) as f:
                if any(line.startswith(self.config + "\t") and line.split("\t")[2][:1].isdigit() for line in f):
                    return
        raise AssertionError("never recorded")

    def run(self, state, env=None, args=("prestart",)):
        if self.record.exists():
            self.record.unlink()
        return subprocess.run(self.private([self.hook, *args]), input=state, capture_output=True, text=True,
                              env=env or self.env, cwd="/", timeout=30)


@pytest.fixture
def front(tmp_path):
    return HookFront(tmp_path, open(SHIPPED).read())


def _bundle(directory, env=(), annotations=None):
    os.makedirs(directory, exist_ok=True)
    spec = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin", *env], "args": ["true"]},
            "root": {"path": "rootfs"}, "annotations": annotations or {}}
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(json.dumps(spec, separators=(",", ":")))
    return str(directory)


def _state(bundle, **extra):
    return json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 42,
                       "bundle": bundle, **extra}, separators=(",", ":"))


@pytest.mark.parametrize("config", [SHIPPED, REFERENCE])
def test_no_gpu_request_exits_0_without_python_under_the_default_configs(tmp_path, config):
    """Both set annotation-prefixes: issue 28 found every start going through Python."""
    front = HookFront(tmp_path, open(config).read())
    result = front.run(_state(_bundle(tmp_path / "b", annotations={"io.kubernetes.pod": "x"})))
    assert result.returncode == 0 and result.stderr == ""
    assert not front.record.exists()


@pytest.mark.parametrize("env, annotations", [
    (["NVIDIA_VISIBLE_DEVICES=all"], None),
    (["CUDA_VERSION=12.4"], None),
    ([], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
    (["X=\\u004eVIDIA_VISIBLE_DEVICES"], None),  # a JSON escape: only Python can tell
])
def test_a_possible_gpu_request_goes_to_python_with_the_whole_state(front, tmp_path, env, annotations):
    state = _state(_bundle(tmp_path / "b", env, annotations))
    assert front.run(state).returncode == 0
    assert front.record.read_text() == state


def test_device_list_mount_goes_to_python(front, tmp_path):
    bundle = _bundle(tmp_path / "b")
    spec = json.loads(open(os.path.join(bundle, "config.json")).read())
    spec["mounts"] = [{"destination": "/var/run/nvidia-container-devices/all", "source": "/dev/null"}]
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(spec, f)
    front.run(_state(bundle))
    assert front.record.exists()


@pytest.mark.parametrize("state", [
    lambda b: _state(b, annotations={"k": "say \"bundle\":\"/elsewhere\""}),  # escapes in the state
    lambda b: _state(b) + "\n" + _state("/elsewhere"),  # two states, two lines
    lambda b: '{"bundlePath":"%s","pid":42}' % b,  # the old key
    lambda b: '{"bundle": "%s", "pid": 42}' % b,  # spaces: not the runtimes' compact form
    lambda b: "",
])
def test_unusual_state_goes_to_python_unchanged(front, tmp_path, state):
    text = state(_bundle(tmp_path / "b"))
    front.run(text)
    assert front.record.read_text() == text


def test_the_names_a_config_adds_are_the_ones_python_recorded(tmp_path):
    front = HookFront(tmp_path, 'swarm-resource = "DOCKER_RESOURCE_GPU"\n'
                                '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["x.io/"]\n')
    for env, annots, python in ((["DOCKER_RESOURCE_GPU=0"], None, True), ([], {"x.io/gpu": "0"}, True),
                                ([], {"cdi.k8s.io/gpu": "0"}, False), (["DOCKER_RESOURCE=1"], None, False)):
        front.run(_state(_bundle(tmp_path / "b", env, annots)))
        assert front.record.exists() == python, (env, annots)


def test_a_config_changed_keeping_its_mtime_goes_to_python(tmp_path):
    """The record names the config's identity; a copy keeping the mtime moves its ctime."""
    front = HookFront(tmp_path, '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["aa.io/"]\n')
    state = _state(_bundle(tmp_path / "b", annotations={"bb.io/gpu": "0"}))
    front.run(state)
    assert not front.record.exists()
    mtime = os.stat(front.config).st_mtime_ns
    new = tmp_path / "new.toml"
    new.write_text('[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["bb.io/"]\n')
    os.utime(new, ns=(mtime, mtime))
    subprocess.run(["cp", "-p", str(new), front.config], check=True)
    front.run(state)
    assert front.record.read_text() == state


def test_no_record_or_a_symlinked_names_folder_goes_to_python(front, tmp_path):
    state = _state(_bundle(tmp_path / "b"))
    names = os.path.join(front.run_dir, "nvct", "names")
    os.rename(names, names + ".real")
    os.symlink(names + ".real", names)
    front.run(state)
    assert front.record.exists()
    front.run(state, env=dict(front.env, NVIDIA_CTK_CONFIG_FILE_PATH=str(tmp_path / "other.toml")))
    assert front.record.exists()


@pytest.mark.parametrize("env", [{"LD_LIBRARY_PATH": "/opt/lib"}, {"LD_PRELOAD": ""}])
def test_loader_variables_leave_the_decision_to_python(front, tmp_path, env):
    front.run(_state(_bundle(tmp_path / "b")), env=dict(front.env, **env))
    assert front.record.exists()


def test_the_legacy_shims_mark_goes_to_python_with_stdin_untouched(front, tmp_path):
    """nvct's legacy shim saw the GPU request and says so in the hook's env: no greps, no copy."""
    state = _state(_bundle(tmp_path / "b"))
    front.run(state, env=dict(front.env, NVCT_GPU_REQUEST="1"))
    assert front.record.read_text() == state


@pytest.mark.parametrize("args", [("poststart",), ("prestart",)])
def test_the_fronts_own_names_in_the_callers_environment_steer_nothing(front, tmp_path, args):
    """The names of the front's own variables, exported by the caller: the state still reaches
    Python whole (the set-aside unset an exported one, and Python got an empty stdin)."""
    state = _state(_bundle(tmp_path / "b", env=["NVIDIA_VISIBLE_DEVICES=0"]))
    own = ("state", "hand_over", "nvct_state", "nvct_stdin", "nvct_append")
    front.run(state, env=dict(front.env, **{name: "1" for name in own}), args=args)
    assert front.record.read_text() == state


@pytest.mark.parametrize("args", [("poststart",), ("--config", "/x", "prestart"), ("--version",)])
def test_other_command_lines_go_to_python(front, tmp_path, args):
    front.run(_state(_bundle(tmp_path / "b")), args=args)
    assert front.record.exists()


def test_missing_bundle_config_goes_to_python(front, tmp_path):
    front.run(_state(str(tmp_path / "nowhere")))
    assert front.record.exists()


_PIECES = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICE", "CUDA_VERSION", "CUDA_", "cdi.k8s.io/", "cdi.k8s.io",
           "/var/run/nvidia-container-devices", "/var/run/nvidia-container-device", "x.io/", "x.io",
           "DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE", "\\", "\\u0043", "=", "/", "é", "\n", "a"]
_SPECS = request_specs(_PIECES, 5)


@pytest.mark.parametrize("text", [
    "",
    'swarm-resource = "DOCKER_RESOURCE_GPU"\n[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["x.io/"]\n',
], ids=["defaults", "swarm and prefixes"])
def test_the_front_decides_as_python_on_any_spec(tmp_path, text):
    """Python starts exactly when nvct.request.container.might_request_gpu says the spec may ask for a GPU."""
    from nvct.config import file as config_mod
    from nvct.request import container as request

    front = HookFront(tmp_path, text)
    config = config_mod.load(front.config)
    bundle = str(tmp_path / "b")
    os.makedirs(bundle)

    @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(spec=_SPECS, ascii_only=st.booleans())
    def check(spec, ascii_only):
        raw = write_spec(bundle, spec, ascii_only=ascii_only)
        assert front.run(_state(bundle)).returncode == 0
        assert front.record.exists() == request.might_request_gpu(raw, config), raw

    check()
