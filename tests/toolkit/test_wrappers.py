"""The installed wrappers, run: the shim with its config once the driver is up, runc directly before.

The "low-level runtime" is a script that records its argv and whether it
was reached through nvct (the wrapper's config variable is set only on that
path). The proc root is a directory whose ``driver/nvidia/version`` says
whether the kernel module is loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from nvct.base import parsecache
from nvct.toolkit import Installation, Layout, Options
from nvct.toolkit.wrappers import runtime_wrapper
from tests.security.test_engine_env import planted  # noqa: F401 - a fixture
from tests.support.fixtures import need_binaries, need_root
from tests.support.legacy_front import with_no_cgroups


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A toolkit whose low-level runtime records its calls, and the node's fake /proc."""
    tmp = tmp_path_factory.mktemp("wrappers")
    proc = tmp / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    record = tmp / "calls"
    fake = tmp / "fake-runc"
    fake.write_text(f'#!/bin/sh\nprintf "%s|%s\\n" "${{NVIDIA_CTK_CONFIG_FILE_PATH:-direct}}" "$*" >> {record}\n'
                    f'if [ -n "${{ENV_DUMP-}}" ]; then env > {record}.env; fi\n')
    fake.chmod(0o755)
    opts = Options(install_dir=str(tmp / "install"), driver_root="/", proc_root=str(proc), python=sys.executable,
                   host_root="/", no_runtime_config=True, low_level_runtimes=[str(fake)])
    Installation(opts, lambda _: None).install()
    return Layout.for_install_dir(opts.install_dir), proc, record


def _run(path: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([path, *args], env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True,
                          text=True, timeout=60, check=False)


def _calls(record) -> list:
    lines = record.read_text().splitlines() if record.exists() else []
    record.unlink(missing_ok=True)
    return lines


@pytest.mark.parametrize("suffix, mode", [("", None), ("cdi", "cdi"), ("legacy", "legacy")])
def test_without_the_module_the_runtime_wrappers_exec_the_low_level_runtime(installed, suffix, mode):
    layout, proc, record = installed
    version = proc / "driver" / "nvidia" / "version"
    version.unlink(missing_ok=True)
    result = _run(layout.runtime(suffix), "state", "ctr-1")
    assert result.returncode == 0, result.stderr
    assert _calls(record) == ["direct|state ctr-1"]
    assert f"the NVIDIA kernel module is not loaded ({proc}/driver/nvidia/version is missing)" in result.stderr


@pytest.mark.parametrize("suffix, mode", [("", None), ("cdi", "cdi"), ("legacy", "legacy")])
def test_with_the_module_the_runtime_wrappers_run_the_shim_with_their_config(installed, suffix, mode):
    layout, proc, record = installed
    (proc / "driver" / "nvidia" / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    result = _run(layout.runtime(suffix), "--root", "/run/x", "state", "ctr-1")
    assert result.returncode == 0, result.stderr
    assert _calls(record) == [f"{layout.config(mode)}|--root /run/x state ctr-1"]
    assert result.stderr == ""


def test_the_proc_root_from_the_environment_wins(installed, tmp_path):
    layout, proc, record = installed
    (proc / "driver" / "nvidia" / "version").write_text("loaded\n")
    result = _run(layout.runtime(), "state", "x", env={"NVCT_PROC_ROOT": str(tmp_path)})
    assert _calls(record) == ["direct|state x"], result.stderr


def test_the_environment_cannot_steer_the_wrappers_python(installed, tmp_path):
    layout, proc, record = installed
    (proc / "driver" / "nvidia" / "version").write_text("loaded\n")
    evil = tmp_path / "nvct"
    evil.mkdir()
    (evil / "__init__.py").write_text("raise SystemExit('imported from PYTHONPATH')\n")
    result = _run(layout.runtime(), "state", "x", env={"PYTHONPATH": str(tmp_path), "PYTHONHOME": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert _calls(record) == [f"{layout.config()}|state x"]


@pytest.mark.parametrize("program", ["nvidia-container-runtime-hook", "nvct", "nvidia-cdi-hook", "nvidia-ctk",
                                     "nvidia-container-cli"])
def test_the_tool_wrappers_run_in_a_hostile_engine_environment(installed, planted, program):
    """A CUDA user's LD_LIBRARY_PATH, an engine's PYTHON* and glibc's variables: set aside, no refusal."""
    layout, _, _ = installed
    mark, env = planted
    for extra in ({"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}, env):
        result = _run(layout.tool(program), "--version", env=extra)
        assert result.returncode == 0 and "version" in result.stdout.lower() and not result.stderr, result.stderr
    assert not list(mark.iterdir())


@pytest.fixture(scope="module")
def bundled_layout(tmp_path_factory):
    """A toolkit running its own copy of this Python (the GPU Operator's install)."""
    tmp = tmp_path_factory.mktemp("bundled-wrappers")
    opts = Options(install_dir=str(tmp / "install"), driver_root="/", proc_root="/proc", python="bundled",
                   host_root="/", no_runtime_config=True, low_level_runtimes=["/bin/true"])
    Installation(opts, lambda _: None).install()
    return Layout.for_install_dir(opts.install_dir)


@pytest.mark.parametrize("program", ["nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvct"])
def test_the_bundled_pythons_wrappers_run_in_a_hostile_engine_environment(bundled_layout, planted, program):
    mark, env = planted
    result = _run(bundled_layout.tool(program), "--version", env=env)
    assert result.returncode == 0 and "version" in result.stdout.lower() and not result.stderr, result.stderr
    assert not list(mark.iterdir())


def test_the_runtime_wrapper_hands_the_runtime_the_engines_environment(installed, planted):
    layout, proc, record = installed
    mark, env = planted
    (proc / "driver" / "nvidia" / "version").write_text("loaded\n")
    os.utime(layout.config(), None)  # just written: not trusted by the front, so through Python
    engine = {"NOTIFY_SOCKET": "/run/x 'y'", "ENV_DUMP": "1", **env}
    result = _run(layout.runtime(), "state", "x", env=engine)
    assert result.returncode == 0, result.stderr
    assert _calls(record) == [f"{layout.config()}|state x"]
    got = (record.parent / (record.name + ".env")).read_text()
    assert all(f"{name}={value}\n" in got for name, value in engine.items()), got
    assert not list(mark.iterdir())


def test_the_nvct_wrapper_uses_the_installed_config(installed):
    layout, proc, record = installed
    result = _run(layout.nvct, "config", "show")
    assert result.returncode == 0, result.stderr
    assert f'proc-root = "{proc}"' in result.stdout
    assert f'path = "{layout.nvct}"' in result.stdout


def test_the_hook_wrapper_runs_the_hook(installed):
    layout, _, _ = installed
    assert _run(layout.hook, "poststart").returncode == 0
    usage = _run(layout.hook, "bogus")
    assert usage.returncode == 2 and "usage: nvidia-container-runtime-hook" in usage.stderr


def test_paths_with_shell_metacharacters_are_quoted(tmp_path):
    layout = Layout(str(tmp_path / "it's $(here)"))
    text = runtime_wrapper(layout, "", None, python="/usr/bin/python3", fallback="/opt/run c", proc_root="/proc")
    script = tmp_path / "wrapper"
    script.write_text(text)
    check = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "'/opt/run c'" in text and "it'\"'\"'s $(here)" in text


def _execs(path: str, *args: str) -> list:
    """The programs that a run of ``path`` execs, through strace."""
    trace = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", path, *args],
                           env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60, check=False)
    return [line.split('"')[1] for line in trace.stderr.splitlines() if "execve(" in line and "= 0" in line]


def _need_strace() -> None:
    need_binaries(shutil.which("strace") or "/usr/bin/strace")  # scripts/setup.sh installs it


@pytest.mark.root  # the shim records only as root
def test_once_the_shim_recorded_the_runtime_other_calls_start_no_python(installed):
    _need_strace()
    layout, proc, record = installed
    (proc / "driver" / "nvidia" / "version").write_text("loaded\n")
    old = os.stat(layout.config()).st_mtime - 60
    os.utime(layout.config(), (old, old))  # a config just written is not trusted yet (nvct.oci.runtime._RACY_NS)
    _run(layout.runtime(), "state", "x")  # through Python: records the runtime for the installed config
    _calls(record)
    execs = [p for p in _execs(layout.runtime(), "state", "y") if p != "/usr/bin/stat"]  # the config's identity
    assert _calls(record) == [f"{layout.config()}|state y"]
    assert execs[0] == layout.runtime() and len(execs) == 2, execs  # the wrapper, then the runtime
    assert "python" not in execs[1]
    os.utime(layout.config(), None)  # an edited config goes through Python again, which re-records
    assert any("python" in p or "ld-linux" in p for p in _execs(layout.runtime(), "state", "z")[1:])
    assert _calls(record) == [f"{layout.config()}|state z"]


def test_the_legacy_wrapper_appends_the_hook_to_a_gpu_create_without_python(installed, tmp_path):
    _need_strace()
    need_root("the shim records its runtime and hook only as root")
    layout, proc, record = installed
    (proc / "driver" / "nvidia" / "version").write_text("loaded\n")
    config = layout.config("legacy")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:  # the front appends the hook only where there are no device rules to write
        f.write(with_no_cgroups(text))
    old = os.stat(config).st_mtime - 60
    os.utime(config, (old, old))
    _run(layout.runtime("legacy"), "state", "x")  # through Python: records the runtime and the hook
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text('{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}')
    _calls(record)
    execs = _execs(layout.runtime("legacy"), "--log-format", "json", "create", "--bundle", str(bundle), "c1")
    assert not any("python" in p or "ld-linux" in p for p in execs), execs
    assert _calls(record) == [f"{config}|--log-format json create --bundle {bundle} c1"]
    [hook] = json.loads((bundle / "config.json").read_text())["hooks"]["prestart"]
    with open(config, "rb") as f:
        digest = parsecache.digest(f.read())
    assert (hook["path"], hook["env"][-3:]) == (layout.hook, [f"NVIDIA_CTK_CONFIG_FILE_PATH={config}",
                                                               f"NVCT_CONFIG_DIGEST={digest}", "NVCT_LOG_FORMAT=json"])
