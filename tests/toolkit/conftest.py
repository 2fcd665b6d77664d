"""Fixtures for the installer's tests: the images the daemons run (``sim_node`` is suite-wide)."""

import os

import pytest

from tests.support.fixtures import busybox_image_tar, pause_image_tar  # noqa: F401 - fixtures


@pytest.fixture
def fake_systemctl(tmp_path, monkeypatch):
    """``systemctl`` first on PATH: records its argv; fails when the unit is ``broken``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "systemctl.argv"
    script = bindir / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\n'
                      f'[ "$2" = broken ] && {{ echo "Unit broken.service not found." >&2; exit 5; }}\nexit 0\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ.get('PATH', '')}")
    return record
