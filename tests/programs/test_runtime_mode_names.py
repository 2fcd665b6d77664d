"""``nvidia-container-runtime.cdi`` and ``.legacy``: the reference's per-mode runtime programs.

Configs written by NVIDIA's tools may name them (``/usr/bin/nvidia-container-runtime.cdi``); the
packages install them as links to the runtime, which takes its mode from the name it runs by.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import node_config
from tests.programs.test_shim import SHIM, _bundle, fake_runc  # noqa: F401 - fake_runc is a fixture


def _create(tmp_path, name: str, config: str, bundle) -> subprocess.CompletedProcess:
    """``create`` through a link called ``name``, beside a ``python3`` that runs this venv's
    (the sh front runs ``$here/python3``, as in a venv's bin dir)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    python = bindir / "python3"
    if not python.exists():
        python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
    os.symlink(SHIM, bindir / name)
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": config}
    return subprocess.run([str(bindir / name), "create", "--bundle", str(bundle), "c1"], env=env,
                          capture_output=True, text=True, check=False)


def test_the_legacy_name_forces_legacy_mode(tmp_path, fake_runc, sim_node):
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=str(fake_runc))
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    r = _create(tmp_path, "nvidia-container-runtime.legacy", config, bundle)
    assert r.returncode == 0, r.stderr
    hooks = json.loads((bundle / "config.json").read_text())["hooks"]
    assert [os.path.basename(h["path"]) for h in hooks["prestart"]] == ["nvidia-container-runtime-hook"]
    assert "createContainer" not in hooks


def test_the_cdi_name_forces_cdi_mode(tmp_path, fake_runc, sim_node):
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=str(fake_runc),
                         extra=f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{tmp_path}/no-specs"]\n')
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    r = _create(tmp_path, "nvidia-container-runtime.cdi", config, bundle)
    # cdi mode resolves nvidia.com/gpu=0 from CDI specs, and there are none
    assert r.returncode == 1 and "nvidia.com/gpu=0" in r.stderr, r.stderr


@pytest.mark.parametrize("name", ["nvidia-container-runtime.bogus", "other.cdi"])
def test_other_names_keep_the_configured_mode(tmp_path, fake_runc, sim_node, name):
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=str(fake_runc))
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    assert _create(tmp_path, name, config, bundle).returncode == 0
    assert "createContainer" in json.loads((bundle / "config.json").read_text())["hooks"]
