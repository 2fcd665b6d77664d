"""Environment sanitizing and capability dropping."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvct.linux import namespaces
from nvct.linux.privileges import drop_capabilities, is_unsafe_env_name, minimal_env, sanitize_environ, set_no_new_privs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (capabilities)")


def test_minimal_env_is_only_a_fixed_path(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/evil.so")
    monkeypatch.setenv("PATH", "/image/bin")
    assert minimal_env() == {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH",
                                  "GLIBC_TUNABLES", "PYTHONPATH", "MALLOC_TRACE"])
def test_loader_and_libc_controls_are_unsafe(name):
    assert is_unsafe_env_name(name)


@pytest.mark.parametrize("name", ["PATH", "NVIDIA_VISIBLE_DEVICES", "HOME", "XLD_PRELOAD"])
def test_ordinary_variables_are_kept(name):
    assert not is_unsafe_env_name(name)


def test_sanitize_environ_on_a_mapping():
    env = {"LD_PRELOAD": "x", "LD_LIBRARY_PATH": "y", "PATH": "/bin", "NVIDIA_X": "1"}
    assert sanitize_environ(env) == ["LD_LIBRARY_PATH", "LD_PRELOAD"]
    assert env == {"PATH": "/bin", "NVIDIA_X": "1"}


def test_children_never_see_ld_preload(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setenv("LD_AUDIT", "/nonexistent/audit.so")
    removed = sanitize_environ()
    assert {"LD_PRELOAD", "LD_AUDIT"} <= set(removed)
    assert "LD_PRELOAD" not in os.environ
    out = subprocess.run(["env"], capture_output=True, text=True, check=True)
    assert "LD_PRELOAD" not in out.stdout
    assert "LD_AUDIT" not in out.stdout
    assert "evil" not in out.stderr  # the loader never tried to preload it


def _caps(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(field)


def test_unknown_capability_names_are_rejected_before_anything_is_dropped():
    before = _caps("CapEff")
    with pytest.raises(ValueError, match="unknown capabilities: flying"):
        drop_capabilities({"flying", "chown"})
    assert _caps("CapEff") == before


@needs_root
def test_drop_capabilities_keeps_only_the_named_ones():
    def work():
        drop_capabilities({"CAP_DAC_OVERRIDE", "chown"})
        set_no_new_privs()
        status = {f: _caps(f) for f in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")}
        with open("/proc/self/status") as f:
            nnp = [line.split()[1] for line in f if line.startswith("NoNewPrivs:")]
        # a root exec gets the bounding set: it must hold across execve too
        after_exec = subprocess.run(["grep", "-E", "^Cap(Eff|Bnd)", "/proc/self/status"],
                                    capture_output=True, text=True).stdout
        return status, nnp, after_exec

    wanted = (1 << 0) | (1 << 1)  # CAP_CHOWN, CAP_DAC_OVERRIDE
    status, nnp, after_exec = namespaces.run_in_child(None, work)
    assert status["CapEff"] == status["CapPrm"] == status["CapBnd"] == wanted
    assert status["CapInh"] == status["CapAmb"] == 0
    assert nnp == ["1"]
    for line in after_exec.splitlines():
        assert int(line.split()[1], 16) == wanted


def test_dropping_capabilities_imports_no_python_prctl():
    code = ("import sys; from nvct.linux import privileges; privileges.drop_capabilities(privileges.CAPABILITIES);"
            "print('prctl' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
