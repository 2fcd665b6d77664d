"""permissions.chain: every program, interpreter, package and directory above them writable by root alone."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from nvct import doctor
from nvct.doctor import permissions
from nvct.linux import ownership
from tests.support.fixtures import skip


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        skip("needs root (the chain must be root-owned)")


def _install_like_pip(tmp_path):
    """A bin directory as pip leaves it: an sh front whose python= names a virtualenv's interpreter."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python3"
    python.write_text("#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n")
    python.chmod(0o755)
    for name in ("nvidia-container-runtime", "nvct"):
        front = venv / "bin" / name
        front.write_text(f"#!/bin/sh\npython=/usr/bin/python3 self=$0\nexec \"$python\" -I - {name} \"$@\"\n")
        front.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text("")
    config.chmod(0o644)
    return venv, config


def _finding(tmp_path, venv, config) -> doctor.Finding:
    options = doctor.Options(config_path=str(config), default_path=str(venv / "bin"),
                             docker_config=str(tmp_path / "none.json"), containerd_config=str(tmp_path / "none.toml"),
                             crio_dir=str(tmp_path / "none.d"))
    (found,) = [f for f in doctor.run(options) if f.id == "permissions.chain"]
    return found


def _clean_interpreter_and_packages() -> bool:
    """This test run's own interpreter and nvct are root-only (as on CI), so any fail is the test's doing."""
    paths = {os.path.realpath(sys.executable), os.path.dirname(os.path.realpath(permissions.__file__))}
    return not any(ownership.ancestor_weaknesses(p) or ownership.tree_weaknesses(p) for p in paths)


def test_a_clean_install_is_ok_and_each_loosened_link_of_the_chain_is_named(tmp_path):
    if not _clean_interpreter_and_packages():
        skip("this checkout itself is writable by others than root")
    venv, config = _install_like_pip(tmp_path)
    found = _finding(tmp_path, venv, config)
    assert found.status == "ok", found
    for loosen, path, why in (
        (lambda p: p.chmod(0o777), venv / "bin" / "python3", "mode 0777, world-writable"),  # what the front runs
        (lambda p: p.chmod(0o664), config, "mode 0664, group 0-writable"),  # sets the hook root runs
        (lambda p: os.chown(p, 65534, -1), venv / "bin" / "nvct", "owned by uid 65534"),
        (lambda p: p.chmod(0o777), venv / "bin", "mode 0777, world-writable"),  # a directory above a program
    ):
        before = os.lstat(path)
        loosen(path)
        try:
            found = _finding(tmp_path, venv, config)
        finally:
            os.chown(path, before.st_uid, before.st_gid)
            path.chmod(stat.S_IMODE(before.st_mode))
        assert found.status == "fail" and f"{path} ({why})" in found.seen, found
        assert str(path) in found.fix


def test_the_package_another_interpreter_of_the_chain_imports_is_walked_too(tmp_path):
    """The engines' programs may run another install's Python (the deb's, a virtualenv's) than the
    doctor's own: what that interpreter imports as nvct is on the chain."""
    import subprocess

    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python3"), "-I", "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip()
    package = os.path.join(site, "nvct")
    os.makedirs(package)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write("")
    os.chmod(os.path.join(package, "__init__.py"), 0o666)
    front = venv / "bin" / "nvidia-container-runtime"
    front.write_text("#!/bin/sh\npython=/usr/bin/python3 self=$0\nexec \"$python\" -I - \"$@\"\n")
    front.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text("")
    found = _finding(tmp_path, venv, config)
    assert found.status == "fail" and f"{package}/__init__.py (mode 0666, world-writable)" in found.seen, found
