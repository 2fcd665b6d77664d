"""The .rpm: built with rpmbuild from a tarball of the tree, then inspected."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.packaging.pkgtest import BUILD_ENV, REPO, build_package, project_version, tree_modules
from tests.support.proc import SYSTEM_PATH, run

from nvct.dropin.version import REFERENCE_VERSION

PROGRAMS = ("nvct", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli",
            "nvidia-cdi-hook", "nvidia-ctk", "nvidia-ctk-installer", "nvidia-toolkit")
UNITS = ("/usr/lib/systemd/system/nvidia-cdi-refresh.service", "/usr/lib/systemd/system/nvidia-cdi-refresh.path")
MODE_RUNTIMES = ("/usr/bin/nvidia-container-runtime.cdi", "/usr/bin/nvidia-container-runtime.legacy")
CONFFILE = "/etc/nvidia-container-runtime/config.toml"
OCI_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
NORMALIZE = "/usr/libexec/nvct/normalize-config"
SITE = re.compile(r"^/usr/lib/python3\.\d+/site-packages/")
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools")


def _missing_tools() -> str:
    missing = [t for t in ("rpmbuild", "rpm2archive") if shutil.which(t, path=SYSTEM_PATH) is None]
    if run(["/usr/bin/python3", "-c", "import build, installer, setuptools, wheel"],
           env=BUILD_ENV, cwd="/").rc != 0:
        missing.append("python3-build, python3-installer, python3-setuptools, python3-wheel")
    return ", ".join(missing)


_MISSING = _missing_tools()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs the .rpm build tools: {_MISSING}")


@pytest.fixture(scope="module")
def rpm(tmp_path_factory) -> SimpleNamespace:
    modules = tree_modules()  # before the build copies the tree
    path = build_package("build-rpm.sh", tmp_path_factory.mktemp("rpm"))

    def query(*args: str) -> str:
        return run(["rpm", "-qp", *args, str(path)], env=BUILD_ENV).check().stdout

    return SimpleNamespace(path=path, modules=modules, query=query, files=query("-l").split(),
                           payload=_payload(path))


def _payload(path: Path) -> dict[str, bytes]:
    """Every regular file in the package: path -> content."""
    with open(path, "rb") as f:
        data = subprocess.run(["rpm2archive", "-"], stdin=f, capture_output=True,
                              env=BUILD_ENV, check=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name[1:]: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_rpm_is_named_and_versioned_for_the_project(rpm):
    version = project_version()
    assert rpm.path.name == f"nvct-{version}-1.noarch.rpm"
    assert rpm.query("--qf", "%{NAME} %{VERSION} %{ARCH}") == f"nvct {version} noarch"


def test_rpm_installs_the_programs_config_hook_and_python_package(rpm):
    wanted = {f"/usr/bin/{p}" for p in PROGRAMS} | set(UNITS) | set(MODE_RUNTIMES) | {CONFFILE, OCI_HOOK, NORMALIZE}
    assert wanted <= set(rpm.files), sorted(wanted - set(rpm.files))
    modules = {SITE.sub("", f) for f in rpm.files if SITE.match(f)}
    assert {"nvct/__init__.py", "nvct/shim.py", "nvct/hook.py", "nvct/cli/__init__.py",
            f"nvct-{project_version()}.dist-info/METADATA"} <= modules
    assert {m for m in modules if m.startswith("nvct/") and m.endswith(".py")} == rpm.modules
    modes = dict(line.rsplit(" ", 1) for line in
                 rpm.query("--qf", "[%{FILENAMES} %{FILEMODES:octal}\n]").splitlines())
    for program in [f"/usr/bin/{p}" for p in PROGRAMS] + [NORMALIZE]:
        assert modes[program].endswith("755"), f"{program}: mode {modes[program]}"


def test_rpm_programs_run_the_system_python3(rpm):
    for program in PROGRAMS:
        text = rpm.payload[f"/usr/bin/{program}"].decode()
        first = text.splitlines()[0]
        # sh fronts that start the system python3 with -I (a line no packager's shebang rewrite drops)
        assert first == "#!/bin/sh" and "python=/usr/bin/python3" in text, f"/usr/bin/{program}"
        assert '"$python" -I' in text, f"/usr/bin/{program}"


def test_rpm_config_is_noreplace_with_the_shipped_content(rpm):
    assert rpm.query("-c").split() == [CONFFILE]
    flags = dict(line.rsplit(" ", 1) for line in
                 rpm.query("--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]").splitlines())
    assert set(flags[CONFFILE]) >= {"c", "n"}  # %config(noreplace)
    assert rpm.payload[CONFFILE] == (REPO / "config/config.toml").read_bytes()
    assert rpm.payload[OCI_HOOK] == (REPO / "hooks/oci-nvidia-hook.json").read_bytes()
    assert rpm.payload[NORMALIZE] == (REPO / "packaging/normalize-config").read_bytes()
    assert NORMALIZE in rpm.query("--scripts")


def test_rpm_requires_the_python_modules(rpm):
    requires = {line.strip() for line in rpm.query("-R").splitlines()}
    assert {"python3-click", "python3-tomlkit", "python3-pyelftools", "python3-prctl",
            "python3-pyyaml", "python3 >= 3.9"} <= requires, sorted(requires)


def test_rpm_takes_the_place_of_the_nvidia_container_toolkit(rpm):
    assert set(rpm.query("--conflicts").split()) == set(TOOLKIT_PACKAGES)
    provides = {line.strip() for line in rpm.query("--provides").splitlines()}
    assert {f"{name} = {REFERENCE_VERSION}" for name in TOOLKIT_PACKAGES} <= provides, sorted(provides)
    assert not any(p.startswith("libnvidia-container1") for p in provides)
    assert rpm.query("--obsoletes").strip() == ""  # never replaced on a plain upgrade


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (rpm sets file owners)")
def test_rpm_keeps_a_config_it_does_not_own_and_an_edited_one_on_erase(rpm, tmp_path):
    # Into a private root, scripts and dependencies left out: rpm's own file handling.
    root = tmp_path / "root"
    conf = root / CONFFILE[1:]
    conf.parent.mkdir(parents=True)
    conf.write_text("left by the NVIDIA Container Toolkit\n")
    rpm_cmd = ["rpm", "--root", str(root), "--nodeps", "--noscripts"]
    run([*rpm_cmd[:3], "--initdb"], env=BUILD_ENV).check()
    run([*rpm_cmd, "-i", str(rpm.path)], env=BUILD_ENV, timeout=60).check()
    assert conf.read_text() == "left by the NVIDIA Container Toolkit\n"
    assert (root / (CONFFILE[1:] + ".rpmnew")).read_bytes() == rpm.payload[CONFFILE]
    for program in PROGRAMS:
        assert (root / "usr/bin" / program).is_file()
    run([*rpm_cmd, "-e", "nvct"], env=BUILD_ENV, timeout=60).check()
    assert not (root / "usr/bin/nvct").exists()
    assert (root / (CONFFILE[1:] + ".rpmsave")).read_text() == "left by the NVIDIA Container Toolkit\n"


def test_rpm_enables_the_cdi_refresh_units(rpm):
    for unit in UNITS:
        assert "WantedBy=multi-user.target" in rpm.payload[unit].decode()
    scripts = rpm.query("--scripts")
    assert "enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service" in scripts
