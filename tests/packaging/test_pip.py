"""pip install under a loose umask: pip writes files as the umask says, so doctor must name them."""

from __future__ import annotations

import json
import shutil
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


def test_an_editable_install_of_the_finder_kind_runs_its_programs(tmp_path):
    """setuptools' default editable install puts nvct on the path by a .pth import line (a finder), which the
    launcher's ``-S`` leaves out until an import fails without it: the programs and click still load."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "nvct_build.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "nvct", src / "nvct", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], env=BUILD_ENV,
                   check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-e", str(src)], env=BUILD_ENV, cwd="/", check=True, timeout=300, capture_output=True)
    [pth] = (venv / "lib" / "python3.11" / "site-packages").glob("__editable__*nvct*.pth")
    assert pth.read_text().startswith("import "), pth.read_text()  # the finder kind, not a path line
    version = subprocess.run([str(venv / "bin" / "nvct"), "--version"], capture_output=True, text=True,
                             env=BUILD_ENV, cwd="/", timeout=60)
    assert (version.returncode, version.stdout.split()[:2]) == (0, ["nvct,", "version"]), version.stderr
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 0, "root": str(tmp_path)})
    hook = subprocess.run([str(venv / "bin" / "nvct"), "hook", "no-such-hook"], input=state, capture_output=True,
                          text=True, env=BUILD_ENV, cwd="/", timeout=60)
    assert hook.returncode == 0 and "unknown hook 'no-such-hook'" in hook.stderr, hook.stderr
