"""packaging/image/Containerfile: the installer image (built where a registry is
reachable; here it is checked by reading it)."""

from __future__ import annotations

import json
import os
import re

from nvct.oci import environ
from tests.packaging.pkgtest import REPO, containerfile_instructions, project_version

CONTAINERFILE = REPO / "packaging" / "image" / "Containerfile"
INSTRUCTIONS = containerfile_instructions(CONTAINERFILE)


def _all(name: str) -> list[str]:
    return [args for instruction, args in INSTRUCTIONS if instruction == name]


def _expand(text: str) -> str:
    args = dict(a.split("=", 1) for a in _all("ARG"))
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def test_image_is_debian_12_slim():
    assert _all("FROM") == ["docker.io/library/debian:12-slim"]


def test_image_installs_the_deb_that_build_deb_makes_for_this_version():
    version = project_version()
    (copy,) = _all("COPY")
    source, destination = _expand(copy).split()
    # scripts/build-deb.sh writes dist/nvct_<version>_all.deb by default.
    assert source == f"dist/nvct_{version}_all.deb"
    assert destination.endswith("/")
    (install,) = [r for r in _all("RUN") if "apt-get" in r]
    installed = destination + source.rsplit("/", 1)[1]
    assert re.search(r"apt-get install -y --no-install-recommends " + re.escape(installed),
                     _expand(install)), install
    assert "rm -rf /var/lib/apt/lists/*" in install


def test_image_runs_the_node_installer_by_the_reference_images_name():
    (entrypoint,) = _all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/bin/nvidia-ctk-installer"]
    # The GPU Operator runs these by name (its entrypoint script is bash, which debian:12-slim has);
    # both are package scripts that run nvct toolkit install.
    for program in ("nvidia-ctk-installer", "nvidia-toolkit"):
        assert f'"nvct/scripts/{program}"' in (REPO / "pyproject.toml").read_text()
        assert os.readlink(REPO / f"nvct/scripts/{program}") == "launcher"
        assert environ.PROGRAMS[program] == "nvct.programs.installer"
    assert not _all("CMD")


def test_image_never_gets_a_gpu_itself():
    assert "NVIDIA_VISIBLE_DEVICES=void" in _all("ENV")
