"""The runtime shim as a process: passthrough, argv untouched, errors where docker shows them."""

import json
import os
import subprocess
import sys

import pytest

from nvct.edits import HOOK_ENV
from tests.support.fixtures import need_root
from tests.support.legacy_front import age

BIN = os.path.dirname(sys.executable)
SHIM = os.path.join(BIN, "nvidia-container-runtime")
HEAVY = ("click", "tomlkit", "yaml", "elftools", "nvct.nvml", "ctypes", "dataclasses", "logging")


@pytest.fixture
def fake_runc(tmp_path):
    """A low-level runtime that records its argv and exits 0."""
    script = tmp_path / "fake-runc"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\n")
    script.chmod(0o755)
    return script


def _config(tmp_path, runtime, extra=""):
    path = tmp_path / "config.toml"
    path.write_text(f'[nvidia-container-runtime]\nruntimes = ["{runtime}"]\n{extra}')
    return str(path)


def _bundle(tmp_path, env):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"ociVersion": "1.0.2-dev", "process": {"env": env, "args": ["true"]}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def run_shim(args, config, cwd=None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVIDIA_CTK_CONFIG_FILE_PATH": config}
    return subprocess.run([SHIM, *args], env=env, cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("args", [["--version"], ["--root", "/r", "start", "x"], ["delete", "--force", "x"],
                                  ["state", "x"]])
def test_other_subcommands_exec_runtime_with_argv_unchanged(tmp_path, fake_runc, args):
    r = run_shim(args, _config(tmp_path, fake_runc))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().split() == args


def test_non_gpu_container_passes_through_with_spec_untouched(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    before = (bundle / "config.json").read_bytes()
    r = run_shim(["create", "--bundle", str(bundle), "c1"], _config(tmp_path, fake_runc))
    assert r.returncode == 0, r.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert (tmp_path / "argv").read_text().split() == ["create", "--bundle", str(bundle), "c1"]


def test_passthrough_imports_nothing_heavy(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    code = ("import os, sys; os.execv = lambda *a: None; sys.argv = [%r];"
            "from nvct.shim import main; main(['create', '--bundle', %r, 'x']);"
            "print(' '.join(m for m in %r if m in sys.modules))" % (SHIM, str(bundle), HEAVY))
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": _config(tmp_path, fake_runc), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_bundle_defaults_to_cwd(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=42"])
    r = run_shim(["create", "c1"], _config(tmp_path, fake_runc), cwd=bundle)
    assert r.returncode == 1
    assert "/proc/driver/nvidia/version: not found: the NVIDIA driver is not loaded" in r.stderr  # read from cwd's bundle


def test_errors_go_to_stderr_runc_log_and_config_log(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=bogus"])
    log = tmp_path / "runc-log.json"
    debug = tmp_path / "nvct.log"
    config = _config(tmp_path, fake_runc, f'debug = "{debug}"\n')
    r = run_shim(["--log", str(log), "--log-format", "json", "create", "--bundle", str(bundle), "c1"], config)
    assert r.returncode == 1
    assert not (tmp_path / "argv").exists()  # the container was never created
    msg = "NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus'"
    assert r.stderr.count("\n") == 1 and msg in r.stderr
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["level"] == "error" and msg in last["msg"] and last["time"].endswith("Z")
    assert msg in debug.read_text()


def test_bad_config_file_is_one_line_for_a_gpu_container(tmp_path, fake_runc):
    config = tmp_path / "config.toml"
    config.write_text("[nvidia-container-runtime\n")
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"nvidia-container-runtime: {config}: invalid TOML: line 1")
    assert not (tmp_path / "argv").exists()


@pytest.mark.parametrize("env, mounts, annotations", [
    (["NVIDIA_VISIBLE_DEVICES=0"], [], {}),
    (["PATH=/bin"], [{"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"}], {}),
    (["PATH=/bin"], [], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
])
def test_bad_config_file_refuses_every_kind_of_gpu_request(tmp_path, fake_runc, env, mounts, annotations):
    config = tmp_path / "config.toml"
    config.write_text("[nvidia-container-runtime\n")
    bundle = _bundle(tmp_path, env)
    spec = json.loads((bundle / "config.json").read_text())
    spec.update(mounts=mounts, annotations=annotations)
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 1 and "invalid TOML" in r.stderr, r.stderr
    assert not (tmp_path / "argv").exists()


def test_no_runtime_found_names_the_list(tmp_path):
    r = run_shim(["--version"], _config(tmp_path, "no-such-runc"))
    assert r.returncode == 1
    assert "nvidia-container-runtime.runtimes: none of ['no-such-runc'] found" in r.stderr


def test_legacy_mode_inserts_the_hook_once(tmp_path, fake_runc, sim_node):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    config = tmp_path / "config.toml"
    config.write_text(open(sim_node["config"]).read() +
                      f'\n[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["{fake_runc}"]\n')
    for _ in range(2):
        r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
        assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    [hook] = spec["hooks"]["prestart"]
    assert hook["path"] == os.path.join(BIN, "nvidia-container-runtime-hook")
    assert hook["args"] == ["nvidia-container-runtime-hook", "prestart"]
    assert hook["env"] == [*HOOK_ENV, "NVCT_GPU_REQUEST=1", f"NVIDIA_CTK_CONFIG_FILE_PATH={config}"]


def test_jit_cdi_mode_writes_devices_mounts_and_hides_env(tmp_path, fake_runc, sim_node):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1", "X=1"])
    config = tmp_path / "config.toml"
    config.write_text(open(sim_node["config"]).read() +
                      f'\n[nvidia-container-runtime]\nmode = "jit-cdi"\nruntimes = ["{fake_runc}"]\n')
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "X=1"]
    assert "/dev/nvidia1" in [d["path"] for d in spec["linux"]["devices"]]
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in spec["linux"]["resources"]["devices"]
    [hook] = spec["hooks"]["createContainer"]
    assert os.path.isabs(hook["path"]) and hook["args"][:3] == ["nvct", "hook", "chain"]
    assert spec["ociVersion"] == "1.0.2-dev" and spec["root"] == {"path": "rootfs"}


def _needs_root():
    need_root("the runtime cache in /run/nvct is root-only")


def _recording_runtime(tmp_path, name):
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\necho {name} \"$@\" > {tmp_path}/argv\n")
    script.chmod(0o755)
    return script


def test_calls_other_than_create_skip_python_while_the_config_is_unchanged(tmp_path, fake_runc):
    config, _ = _recorded(tmp_path, fake_runc)
    # Same mtime, different bytes: only the shell front can still take the recorded runtime
    # without the warning that Python gives for a broken config.
    _broken_keeping_mtime(config)
    for args in (["--root", "/r", "start", "c1"], ["delete", "--force", "c1"], ["--version"]):
        r = run_shim(args, config)
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        assert (tmp_path / "argv").read_text().split() == args


@pytest.mark.parametrize("seconds", [60, 0])  # an old config (cached), one written just now (never cached)
def test_an_edited_runtimes_list_takes_effect_on_the_very_next_call(tmp_path, seconds):
    _needs_root()
    old, new = _recording_runtime(tmp_path, "old-runc"), _recording_runtime(tmp_path, "new-runc")
    config = _config(tmp_path, old)
    age(config, seconds)
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    assert run_shim(["create", "--bundle", str(bundle), "c1"], config).returncode == 0
    assert run_shim(["state", "c1"], config).returncode == 0
    assert (tmp_path / "argv").read_text().split() == ["old-runc", "state", "c1"]
    _config(tmp_path, new)
    for args in (["state", "c1"], ["delete", "c1"], ["--version"]):
        r = run_shim(args, config)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().split() == ["new-runc", *args]


def test_a_broken_config_keeps_the_runtime_its_containers_were_created_with(tmp_path, fake_runc):
    _needs_root()
    config = _config(tmp_path, fake_runc)
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    assert run_shim(["create", "--bundle", str(bundle), "c1"], config).returncode == 0
    with open(config, "w") as f:
        f.write("[nvidia-container-runtime\n")
    for args in (["create", "--bundle", str(bundle), "c2"], ["start", "c1"], ["delete", "--force", "c1"]):
        r = run_shim(args, config)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().split() == args
        assert r.stderr == (f"nvidia-container-runtime: warning: {config}: invalid TOML: line 1, column 26: "
                            f"{r.stderr.split('column 26: ')[1].split(';')[0]}; running {fake_runc} "
                            "without GPU support\n")


def _broken_keeping_mtime(config, first_line=""):
    """The config made unreadable with its mtime kept: only the sh front can still go on quietly
    (Python warns that it runs the recorded runtime without GPU support, or refuses a GPU start)."""
    mtime = os.stat(config).st_mtime_ns
    with open(config, "w") as f:
        f.write(first_line + "[nvidia-container-runtime\n")
    os.utime(config, ns=(mtime, mtime))


def _recorded(tmp_path, runtime):
    """A config whose runtime the shim has recorded (a non-GPU create went through Python)."""
    _needs_root()
    config = _config(tmp_path, runtime)
    age(config)
    plain = _bundle(tmp_path, ["PATH=/bin"])
    assert run_shim(["create", "--bundle", str(plain), "c1"], config).returncode == 0
    return config, plain


def test_a_create_that_asks_for_no_gpu_skips_python(tmp_path, fake_runc):
    config, bundle = _recorded(tmp_path, fake_runc)
    _broken_keeping_mtime(config)
    for args in (["--root", "/r", "create", "--bundle", str(bundle), "c2"],
                 ["create", "--pid-file", "/p", f"--bundle={bundle}", "c2"],
                 ["run", "-b", str(bundle), "--preserve-fds", "1", "c2"]):
        r = run_shim(args, config)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert (tmp_path / "argv").read_text().split() == args
    r = run_shim(["create", "c3"], config, cwd=str(bundle))  # the bundle defaults to the cwd
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("env, annotations", [
    (["NVIDIA_VISIBLE_DEVICES=all"], {}), (["CUDA_VERSION=12.4"], {}),
    (["\\u004eVIDIA_VISIBLE_DEVICES=all"], {}),  # a request hidden by a JSON escape
    ([], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
])
def test_a_create_that_may_ask_for_a_gpu_goes_to_python(tmp_path, fake_runc, env, annotations):
    config, _ = _recorded(tmp_path, fake_runc)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    spec = {"process": {"env": env, "args": ["true"]}, "root": {"path": "rootfs"}, "annotations": annotations}
    (gpu / "config.json").write_text(json.dumps(spec).replace("\\\\u004e", "\\u004e"))
    assert ("\\" in (gpu / "config.json").read_text()) == "".join(env).startswith("\\")
    _broken_keeping_mtime(config)
    r = run_shim(["create", "--bundle", str(gpu), "c2"], config)
    assert r.returncode == 1 and "invalid TOML" in r.stderr, r.stderr  # Python refused the GPU start


def test_one_dash_global_flags_are_read_as_runc_reads_them(tmp_path, fake_runc):
    """``-log-format json create``: the sh front once took "json" for the subcommand and passed the
    create through untouched; a GPU create must reach Python."""
    config, _ = _recorded(tmp_path, fake_runc)
    (tmp_path / "g").mkdir()
    gpu = _bundle(tmp_path / "g", ["NVIDIA_VISIBLE_DEVICES=0"])
    _broken_keeping_mtime(config)
    r = run_shim(["-root", "/r", "-log-format", "json", "create", "--bundle", str(gpu), "c2"], config)
    assert r.returncode == 1 and "invalid TOML" in r.stderr, r.stderr  # Python refused the GPU start
    r = run_shim(["-root", "/r", "-log-format", "json", "state", "c2"], config)
    assert r.returncode == 0 and (tmp_path / "argv").read_text().split() == ["-root", "/r", "-log-format", "json",
                                                                             "state", "c2"]


@pytest.mark.parametrize("args", [["create", "-bundle", "{b}", "c2"], ["create", "--b", "{b}", "c2"],
                                  ["create", "--bundle"], ["create", "--bundle=", "c2"]])
def test_unusual_create_command_lines_go_to_python(tmp_path, fake_runc, args):
    config, bundle = _recorded(tmp_path, fake_runc)
    _broken_keeping_mtime(config)
    r = run_shim([a.format(b=bundle) for a in args], config, cwd=str(bundle))
    assert "invalid TOML" in r.stderr, r.stderr


@pytest.mark.parametrize("line", ['swarm-resource = "DOCKER_RESOURCE_GPU"\n', 'annotation-prefixes = ["x/"]\n'])
def test_a_config_that_adds_request_names_sends_create_to_python(tmp_path, fake_runc, line):
    config, bundle = _recorded(tmp_path, fake_runc)
    _broken_keeping_mtime(config, line)
    r = run_shim(["create", "--bundle", str(bundle), "c2"], config)
    assert "invalid TOML" in r.stderr, r.stderr


def test_both_sh_fronts_grep_for_every_name_a_request_may_use():
    import re

    from nvct import config as config_mod, request

    defaults = config_mod.Config(None)
    names = {request.VISIBLE_DEVICES, request.CUDA_VERSION, request.DEVICE_LIST_ROOT,
             *defaults.get("nvidia-container-runtime.modes.cdi.annotation-prefixes")}
    assert not request.might_request_gpu(b"{}", defaults)
    for name in names:
        assert request.might_request_gpu(name.encode(), defaults)
    scripts = os.path.join(os.path.dirname(request.__file__), "scripts")
    for script in ("nvidia-container-runtime", "nvidia-container-runtime-hook"):
        with open(os.path.join(scripts, script)) as f:
            text = f.read()
        grep = text[text.index('"$grep" -q -F'):]
        grep = grep[:grep.index('config.json"')]
        assert set(re.findall(r"-e (\S+)", grep)) == names | {"'\\'"}, script
