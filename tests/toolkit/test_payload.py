"""The copy of nvct the host runs, and the entry point that checks the host's Python can run it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvct.base.errors import NvctError
from nvct.toolkit import payload
from nvct.toolkit.layout import ENTRY


def _entry(python_dir, *args, flags=("-I",)) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, os.path.join(python_dir, ENTRY), *args],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_nvct_and_its_dependencies_are_copied_without_bytecode(tmp_path):
    copied = payload.copy_python(str(tmp_path))
    assert copied == ["nvct", *payload.DEPENDENCIES]
    assert (tmp_path / "nvct" / "programs" / "shim.py").is_file()
    assert (tmp_path / "prctl.py").is_file()
    assert [p.name for p in tmp_path.glob("_prctl*.so")]
    assert not list(tmp_path.rglob("*.pyc"))


def test_a_module_the_installer_cannot_import_is_named(tmp_path):
    with pytest.raises(NvctError, match="cannot copy the Python module 'no_such_module_xyz' to the host"):
        payload.copy_python(str(tmp_path), ("no_such_module_xyz",))


def test_the_check_passes_with_everything_copied(tmp_path):
    payload.copy_python(str(tmp_path))
    result = _entry(str(tmp_path), "nvct", "/x/nvct", "--check", flags=("-I", "-S"))  # -S: nothing but the copy
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"ok: Python {sys.version.split()[0]}")
    assert list((tmp_path / "nvct" / "programs" / "__pycache__").glob("shim.*.pyc"))


def test_the_check_names_what_the_hosts_python_lacks(tmp_path):
    payload.copy_python(str(tmp_path), ("nvct",))
    result = _entry(str(tmp_path), "nvct", "/x/nvct", "--check", flags=("-I", "-S"))
    assert result.returncode == 1
    assert result.stderr.startswith("missing: click (ModuleNotFoundError: No module named 'click')")


def test_the_entry_runs_the_named_program_with_the_wrapper_as_argv0(tmp_path):
    payload.copy_python(str(tmp_path))
    result = _entry(str(tmp_path), "nvct", "/opt/toolkit/nvct", "--version")
    assert result.returncode == 0 and result.stdout == "nvct, version 0.1.0\n"
    usage = _entry(str(tmp_path), "bash")
    assert usage.returncode == 2 and "usage: python3 -I" in usage.stderr


def test_one_dependency_list_says_what_is_copied_and_what_the_check_needs():
    # The copy and the host's check read the same table: a module the check needs is always copied.
    from nvct.toolkit import entry

    assert payload.DEPENDENCIES == tuple(entry.DEPENDENCIES)
    assert set(entry.required()) <= set(payload.DEPENDENCIES)
    assert {"click", "yaml"} <= set(entry.required())
    assert "elftools" not in entry.DEPENDENCIES  # nvct.linux.elf reads ELF files itself
    assert ("tomlkit" in entry.required()) == (sys.version_info < (3, 11))
    assert not {"prctl", "_prctl"} & set(entry.required())  # nvct.linux.privileges falls back to libc
