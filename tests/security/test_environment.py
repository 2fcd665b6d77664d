"""LD_PRELOAD & co. from the image must not reach what the hook runs (CVE-2025-23266).

The hook's cwd can be the container's rootfs, so ``LD_PRELOAD=./x.so`` names
an image file. sanitize_environ() removes such variables before the hook
starts anything; ldconfig gets a fixed environment regardless.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from nvct.linux.privileges import minimal_env, sanitize_environ
from tests.support.fixtures import skip

PRELOAD_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
    const char *marker = getenv("NVCT_MARKER");
    if (marker) close(open(marker, O_CREAT | O_WRONLY, 0600));
}
"""


@pytest.fixture
def evil_image(tmp_path):
    """A 'container rootfs' holding a preload library that leaves a marker."""
    if shutil.which("gcc") is None:
        skip("needs gcc")
    root = tmp_path / "root"
    root.mkdir()
    src = tmp_path / "evil.c"
    src.write_text(PRELOAD_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "evil.so"), str(src)],
                   check=True)
    return root


def _run_true(cwd):
    subprocess.run(["/bin/true"], cwd=cwd, check=True)


def test_the_preload_attack_is_real(evil_image, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("NVCT_MARKER", str(marker))
    monkeypatch.setenv("LD_PRELOAD", "./evil.so")
    _run_true(evil_image)
    assert marker.exists()


def test_sanitized_environment_starts_nothing_from_the_image(evil_image, tmp_path,
                                                             monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("NVCT_MARKER", str(marker))
    monkeypatch.setenv("LD_PRELOAD", "./evil.so")
    monkeypatch.setenv("LD_AUDIT", "./evil.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", ".")
    assert sanitize_environ() == ["LD_AUDIT", "LD_LIBRARY_PATH", "LD_PRELOAD"]
    _run_true(evil_image)
    assert not marker.exists()


def test_fixed_environment_for_children(evil_image, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("LD_PRELOAD", "./evil.so")
    env = minimal_env()
    env["NVCT_MARKER"] = str(marker)  # only to detect the constructor
    subprocess.run(["/bin/true"], cwd=evil_image, env=env, check=True)
    assert not marker.exists()


# --- the sh fronts and nvct.oci.environ: the caller's environment, set aside before the interpreter ---

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "nvct", "scripts")
#: Values a front must carry through unchanged: newlines (one that looks like `export -p`'s next
#: line), quotes, globs, expansions, backslashes, empty, long; a name it must not keep (NVCT_ENV_*).
ODD = {"PATH": "/usr/bin:/bin", "A": "x\nexport LD_PRELOAD='/evil.so'\ny", "B": "it's \"quoted\"", "C": "*",
       "D": "$(touch /tmp/nvct-front-ran) `id` $HOME \\n \\", "E": "", "F1": "a" * 5000, "G": " lead trail ",
       "LD_LIBRARY_PATH": "lib", "PYTHONPATH": "/x", "GCONV_PATH": "/g", "NVCT_ENV_A": "not mine"}


@pytest.fixture(params=["/bin/dash", "/bin/bash --posix", "/bin/busybox sh"])
def front(request, tmp_path):
    """Run a front under a shell; returns what its interpreter got (a fake python3 records it)."""
    shell = request.param.split()
    if not os.path.exists(shell[0]):
        skip(f"needs {shell[0]}")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("nvidia-cdi-hook", "nvidia-container-runtime"):
        shutil.copy(os.path.join(SCRIPTS, name), bindir / name)
    record = tmp_path / "env"
    (bindir / "python3").write_text(f"#!/bin/sh\nexec /usr/bin/env -0 > {record}\n")
    (bindir / "python3").chmod(0o755)

    # As root, an empty /run of its own: a record the host's /run/nvct holds for the default config
    # would have the runtime front exec that runtime instead of the interpreter.
    private_run = ["unshare", "-m", "/bin/sh", "-c", 'mount -t tmpfs tmpfs /run && exec "$@"', "-"]

    def run(program: str, env: dict, *args: str) -> dict:
        argv = [*shell, str(bindir / program), *args]
        subprocess.run([*private_run, *argv] if os.geteuid() == 0 else argv, env=env, check=True, timeout=30,
                       cwd=tmp_path)
        got = dict(item.split("=", 1) for item in record.read_text().split("\0") if item)
        record.unlink()
        return got
    return run


def _restored(monkeypatch, got: dict, program: str, argv: list) -> dict:
    from nvct.oci import environ as hookenv

    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in got.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hookenv, "_caller", None)
    monkeypatch.setattr(hookenv, "dropped", [])
    monkeypatch.chdir("/")
    hookenv.start(program, [program, *argv])
    return hookenv.caller_environ()


#: What a shell itself exports (dash: PWD; bash: PWD, SHLVL, _).
SHELLS_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}


@pytest.mark.parametrize("program", ["nvidia-cdi-hook", "nvidia-container-runtime"])
def test_the_interpreter_sees_none_of_the_callers_names(front, program):
    got = front(program, ODD, "--version")
    assert set(k for k in got if not k.startswith("NVCT_ENV_")) <= SHELLS_OWN, got.keys()
    assert got["NVCT_ENV_A"] == ODD["A"] and got["NVCT_ENV_LD_LIBRARY_PATH"] == "lib"  # the caller's own dropped
    assert not os.path.exists("/tmp/nvct-front-ran")


def test_python_gets_the_callers_environment_back_exactly(front, monkeypatch):
    got = front("nvidia-container-runtime", ODD, "state", "x")
    caller = _restored(monkeypatch, got, "nvidia-container-runtime", ["state", "x"])
    mine = {k: v for k, v in ODD.items() if not k.startswith("NVCT_ENV_")}
    assert {k: v for k, v in caller.items() if k not in SHELLS_OWN} == mine
    assert os.environ == {"PATH": "/usr/bin:/bin"}  # what the shim itself runs with


def test_each_kind_takes_back_its_own_list():
    from nvct.oci.environ import STEP_PATH, taken_back

    caller = {"PATH": "/p", "NVIDIA_CTK_CONFIG_FILE_PATH": "/c.toml", "NVCT_PROC_ROOT": "/proc", "HOME": "/root",
              "LD_LIBRARY_PATH": "/usr/local/cuda/lib64", "PYTHONDONTWRITEBYTECODE": "1", "GCONV_PATH": "/g",
              "LOCPATH": "/l", "NLSPATH": "/n", "TZDIR": "/z", "HOSTALIASES": "/h", "LD_AUDIT": "x", "TMPDIR": "/t",
              "DOCKER_HOST": "unix:///x"}
    step = taken_back("nvidia-cdi-hook", ["nvidia-cdi-hook", "create-symlinks"], caller)
    assert step == ({"PATH": STEP_PATH}, sorted(caller))
    engine, dropped = taken_back("nvidia-container-runtime-hook", ["h", "prestart"], caller)
    assert engine == {"PATH": "/p", "NVIDIA_CTK_CONFIG_FILE_PATH": "/c.toml", "NVCT_PROC_ROOT": "/proc"}
    manage, dropped = taken_back("nvct", ["nvct", "doctor"], caller)
    assert set(dropped) == {"LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE", "GCONV_PATH", "LOCPATH", "NLSPATH",
                            "TZDIR", "HOSTALIASES", "LD_AUDIT"}
    assert manage["DOCKER_HOST"] == "unix:///x" and manage["TMPDIR"] == "/t"
    assert taken_back("nvct", ["nvct", "hook", "chain"], caller)[0] == {"PATH": STEP_PATH}
    assert taken_back("nvidia-container-cli", ["c", "configure", "/r"], caller)[0] == engine


@pytest.mark.parametrize("name, value, refused", [
    ("NVIDIA_CTK_CONFIG_FILE_PATH", "/etc/nvidia-container-runtime/config.toml", False),
    ("NVIDIA_CTK_CONFIG_FILE_PATH", "config.toml", True),
    ("NVIDIA_CTK_CONFIG_FILE_PATH", "/proc/self/cwd/c.toml", True),
    ("NVIDIA_CTK_CONFIG_FILE_PATH", "//proc/1/root/c.toml", True),
    ("NVIDIA_CTK_CONFIG_FILE_PATH", "/etc/./c.toml", True),
    ("XDG_CONFIG_HOME", "cfg", True),
    ("NVCT_PROC_ROOT", "/proc", False),
    ("NVCT_PROC_ROOT", "/proc/1/root/proc", True),
    ("NVCT_DRIVER_ROOT", "/run/nvidia/driver", False),
    ("NVCT_DRIVER_ROOT", "/", False),
    ("NVCT_DEV_ROOT", "../dev", True),
])
def test_refused_only_where_the_working_directory_would_decide(name, value, refused):
    from nvct.oci.environ import refusal

    why = refusal("nvidia-container-runtime-hook", ["h", "prestart"], {name: value})
    assert bool(why) == refused, why
    if refused:
        assert why.startswith(f"{name}={value} in its environment") and "the engine's" in why
    assert refusal("nvidia-cdi-hook", ["h"], {name: value}) is None  # takes nothing back: nothing to refuse
    assert refusal("nvct", ["nvct", "config"], {name: value}) is None
