"""The hook programs start isolated however they were installed: no PYTHONHOME takeover.

pip rewrites a ``#!python -I`` shebang to the venv's interpreter and drops ``-I``;
without it the interpreter imports ``encodings`` from ``$PYTHONHOME`` before the
script's first line. The programs start as ``#!/bin/sh`` and exec ``python -I``.
Checked on a real wheel install (what ``pip install nvct`` does), on the editable
install the tests use, and (tests/packaging/test_deb.py) on the deb.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK_PROGRAMS = (("nvct", "hook", "chain"), ("nvidia-cdi-hook", "update-ldcache"),
                 ("nvidia-container-runtime-hook", "prestart"), ("nvidia-ctk", "hook", "chmod"))
MARKER_MODULE = """
import os  # frozen; no open() yet while encodings loads
fd = os.open(os.path.join(%r, "ran.%%d" %% os.getpid()), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, os.readlink("/proc/self/exe").encode())
"""


def assert_hooks_start_isolated(bindir: str, tmp_path) -> None:
    """Each hook program in ``bindir`` ignores a PYTHONHOME/PYTHONPATH planting ``encodings``,
    ``site`` and ``nvct``: its sh front sets them aside, and it goes on to its own one-line error
    (the state ``{}`` names no container), never a refusal of the caller's variables."""
    marks = tmp_path / "marks"
    marks.mkdir()
    home = tmp_path / "home"
    lib = home / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for name in ("encodings/__init__.py", "site.py", "sitecustomize.py", "nvct/__init__.py"):
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text(MARKER_MODULE % str(marks))
    for argv in HOOK_PROGRAMS:
        program = os.path.join(bindir, argv[0])
        for var, value in (("PYTHONHOME", home), ("PYTHONPATH", lib)):
            r = subprocess.run([program, *argv[1:]], input="{}", capture_output=True, text=True, timeout=60,
                               env={"PATH": "/usr/bin:/bin", var: str(value)}, cwd=str(tmp_path))
            assert not os.listdir(marks), (program, var, os.listdir(marks))
            assert r.stderr.count("\n") <= 1 and "Traceback" not in r.stderr, (program, var, r.stderr)
            assert "refusing to run" not in r.stderr and var not in r.stderr, r.stderr
        with open(program) as f:
            assert f.readline() == "#!/bin/sh\n", program  # a line no installer rewrites


def test_the_editable_install_starts_isolated(tmp_path):
    assert_hooks_start_isolated(os.path.dirname(sys.executable), tmp_path)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory):
    """A fresh venv with nvct installed from its wheel, as ``pip install`` does."""
    base = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    pip = [sys.executable, "-m", "pip"]
    r = subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"), REPO],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(base))
    assert r.returncode == 0, r.stderr
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(base / "venv")], check=True)
    [wheel] = os.listdir(base / "dist")
    r = subprocess.run([str(base / "venv/bin/python"), "-m", "pip", "install", "-q", "--no-deps",
                        str(base / "dist" / wheel)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return str(base / "venv/bin")


def test_a_wheel_install_starts_isolated(wheel_venv, tmp_path):
    assert_hooks_start_isolated(wheel_venv, tmp_path)
    # and still runs: the sh front found the venv's interpreter, which finds nvct
    r = subprocess.run([os.path.join(wheel_venv, "nvct"), "--version"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("nvct, version"), r.stderr
