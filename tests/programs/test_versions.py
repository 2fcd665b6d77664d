"""``--version`` of every program: the reference's first line, ``commit: nvct <version>``;
the runtime's also shows the low-level runtime's own, as the reference's does."""

from __future__ import annotations

import os
import subprocess

import pytest

from nvct import __version__
from tests.e2e.conftest import VENV_BIN
from tests.support.fixtures import skip

RUNC = "/usr/sbin/runc"


def version_of(program: str, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run([os.path.join(VENV_BIN, program), *args], capture_output=True, text=True,
                          env=env or {"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("program, title", [
    ("nvidia-container-runtime-hook", "NVIDIA Container Runtime Hook"),
    ("nvidia-cdi-hook", "NVIDIA CDI Hook"),
    ("nvidia-ctk", "NVIDIA Container Toolkit CLI"),
    ("nvidia-ctk-installer", "NVIDIA Container Toolkit Installer"),
])
def test_reference_form(program, title):
    assert version_of(program, "--version").splitlines() == [f"{title} version {__version__}",
                                                             f"commit: nvct {__version__}"]


def test_the_runtime_shows_nvct_then_the_low_level_runtime(tmp_path):
    if not os.access(RUNC, os.X_OK):
        skip(f"needs {RUNC}")
    config = tmp_path / "config.toml"
    config.write_text(f'[nvidia-container-runtime]\nruntimes = ["{RUNC}"]\n')
    out = version_of("nvidia-container-runtime", "--version",
                     env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)})
    runc = subprocess.run([RUNC, "--version"], capture_output=True, text=True, check=True).stdout
    assert out == (f"NVIDIA Container Runtime version {__version__}\ncommit: nvct {__version__}\n"
                   f"spec: 1.2.0\n\n{runc}")


def test_the_hook_takes_gos_single_dash_form_too():
    assert version_of("nvidia-container-runtime-hook", "-version").startswith("NVIDIA Container Runtime Hook")
