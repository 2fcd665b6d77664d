"""The bundled Python runtime: what it holds, and that nothing outside it steers it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from nvct.base.errors import NvctError
from nvct.toolkit import payload, python as runtime


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("runtime"))
    runtime.bundle(root)
    payload.copy_python(os.path.join(root, "lib", "python"))
    runtime.copy_libraries(root)
    return root


def _python(root: str, code: str, env: dict) -> dict:
    proc = subprocess.run([*runtime.command(root), "-I", "-c", code], capture_output=True, text=True,
                          env=env, cwd="/", check=True)
    return json.loads(proc.stdout)


def test_it_carries_its_loader_libc_and_every_library_its_modules_need(bundled):
    libs = set(os.listdir(os.path.join(bundled, "lib")))
    assert {"ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libffi.so.8"} <= libs
    assert not os.path.exists(os.path.join(bundled, "lib", runtime.python_name(), "test"))


def test_sys_path_is_the_bundle_whatever_the_environment_says(bundled):
    env = {"PATH": "/usr/bin:/bin", "PYTHONHOME": "/usr", "PYTHONPATH": "/usr/lib/python3/dist-packages",
           "LD_LIBRARY_PATH": "/lib/x86_64-linux-gnu", "PYTHONSAFEPATH": "0"}
    got = _python(bundled, "import sys, json, ctypes, yaml, click, nvct.programs.shim; print(json.dumps("
                  "[sys.path, sys.prefix, sys.flags.isolated, sorted(m.__file__ for m in "
                  "(ctypes, yaml, click, nvct.programs.shim))]))", env)
    paths, prefix, isolated, files = got
    assert paths == [os.path.join(bundled, "lib", runtime.python_name()),
                     os.path.join(bundled, "lib", runtime.python_name(), "lib-dynload"),
                     os.path.join(bundled, "lib", "python")]
    assert prefix.startswith(bundled + "/") and isolated == 1  # the ._pth file's directory
    assert all(f.startswith(bundled + "/") for f in files)


def test_libc_comes_from_the_bundle(bundled):
    maps = _python(bundled, "import json; print(json.dumps(open('/proc/self/maps').read()))", {})
    libs = {line.split()[-1] for line in maps.splitlines() if ".so" in line}
    assert libs and all(p.startswith(bundled + "/") for p in libs), libs


def test_a_library_the_image_lacks_is_named(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    monkeypatch.setattr(runtime, "_cache", lambda: {})
    monkeypatch.setattr(runtime, "_find", lambda soname: None)
    with pytest.raises(NvctError, match=r"needs libm\.so\.6, which the installer's image lacks"):
        runtime.copy_libraries(str(tmp_path), elf_files=[os.path.realpath("/usr/bin/python3")])
