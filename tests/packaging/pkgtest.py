"""Shared by the packaging tests: where the tree is, how to build and inspect packages."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support.proc import SYSTEM_PATH, run

REPO = Path(__file__).resolve().parents[2]
#: The environment the build scripts and package tools run under: Debian's
#: PATH only, so a pyenv or virtualenv python3 can never be picked up.
BUILD_ENV = {"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def project_version() -> str:
    """``[project] version`` from pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def tree_modules() -> set[str]:
    """The package's modules in this tree, as ``nvct/...py`` paths."""
    return {str(p.relative_to(REPO)) for p in (REPO / "nvct").rglob("*.py")
            if "__pycache__" not in p.parts}


def build_package(script: str, out_dir: Path, timeout: float = 180, env: dict | None = None) -> Path:
    """Run ``scripts/<script> OUT_DIR`` and return the package it built.

    A python3 that fails comes first on PATH and a virtualenv is active, as on a
    developer's machine with pyenv: the build must use Debian's interpreter anyway.
    And the umask is 000: no packaged file may come out writable by others for that.
    """
    decoy = out_dir / "decoy-bin"
    decoy.mkdir(parents=True)
    for name in ("python3", "python", "pip", "pip3"):
        exe = decoy / name
        exe.write_text(f'#!/bin/sh\necho "decoy {name} was run" >&2\nexit 97\n')
        exe.chmod(0o755)
    env = {**BUILD_ENV, "PATH": f"{decoy}:{BUILD_ENV['PATH']}", "VIRTUAL_ENV": str(decoy.parent), **(env or {})}
    result = run(["sh", "-c", 'umask 000 && exec bash "$@"', "sh", str(REPO / "scripts" / script), str(out_dir)],
                 env=env, timeout=timeout).check()
    return Path(result.stdout.strip().splitlines()[-1])


_BUILT: dict[str, Path] = {}


def built_deb(tmp_path_factory) -> Path:
    """This tree's .deb, built once per session for every test that inspects or installs it."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _BUILT:
        _BUILT[key] = build_package("build-deb.sh", tmp_path_factory.mktemp("deb-build"))
    return _BUILT[key]


def no_driver_config(tmp_path: Path) -> Path:
    """A config for a node whose kernel has no NVIDIA module loaded (its roots under ``tmp_path``)."""
    empty = tmp_path / "no-driver"
    (empty / "proc").mkdir(parents=True)
    (empty / "proc" / "devices").write_text("Character devices:\n  1 mem\n  5 /dev/tty\n")
    config = tmp_path / "no-driver.toml"
    config.write_text(f'[nvidia-container-cli]\nroot = "{empty}"\n[nvct]\ndev-root = "{empty}"\n'
                      f'proc-root = "{empty}/proc"\n')
    return config


def containerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile: comments dropped, continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        instructions.append((word.upper(), " ".join(rest.split())))
    return instructions
