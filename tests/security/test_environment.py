"""LD_PRELOAD & co. from the image must not reach what the hook runs (CVE-2025-23266).

The hook's cwd can be the container's rootfs, so ``LD_PRELOAD=./x.so`` names
an image file. sanitize_environ() removes such variables before the hook
starts anything; ldconfig gets a fixed environment regardless.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nvct.privileges import minimal_env, sanitize_environ

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
        pytest.skip("needs gcc")
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
