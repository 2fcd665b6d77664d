"""pip install under a loose umask: pip writes files as the umask says, so doctor must name them."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.packaging.pkgtest import BUILD_ENV, REPO
from tests.support.fixtures import need_root


def _doctor(venv) -> dict:
    proc = subprocess.run([str(venv / "bin" / "nvct"), "doctor", "--json", "--docker-config", str(venv / "none.json")],
                          capture_output=True, text=True, env=BUILD_ENV, cwd="/", timeout=60, check=False)
    return {f["id"]: f for f in json.loads(proc.stdout)["findings"]}["permissions.chain"]


def test_a_pip_install_under_umask_000_is_named_by_doctor_until_mended(tmp_path):
    need_root("the doctor checks that the chain is root-owned")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], env=BUILD_ENV,
                   check=True, timeout=120)
    # pip creates files 0666 & ~umask: with umask 000, every file and directory is world-writable
    subprocess.run(f"umask 000 && exec {venv}/bin/pip install -q --no-deps --no-build-isolation --no-index {REPO}",
                   shell=True, env=BUILD_ENV, cwd="/", check=True, timeout=300, capture_output=True)
    package = venv / "lib" / "python3.11" / "site-packages" / "nvct"
    if not package.is_dir():
        pytest.fail(f"pip put nvct elsewhere than {package}")
    finding = _doctor(venv)
    assert finding["status"] == "fail", finding
    assert f"{venv}/bin/nvct (mode 0777, world-writable)" in finding["seen"]
    assert finding["fix"].startswith("chmod -R go-w ") and str(package) in finding["fix"]
    subprocess.run(["chmod", "-R", "go-w", str(venv)], check=True)
    assert _doctor(venv)["status"] == "ok"
