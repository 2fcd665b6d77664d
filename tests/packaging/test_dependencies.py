"""pyelftools is a test dependency only: nvct reads ELF files itself (nvct.linux.elf).

A virtualenv of its own (no system site-packages) holds the wheel built from this
tree and, linked from this machine, the modules of the wheel's runtime
requirements and nothing else: the programs run there on the simulated node as on
a node whose packages were installed from those requirements alone.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.packaging.pkgtest import BUILD_ENV, REPO
from tests.support.bundle import make_bundle, read_config
from tests.support.fixtures import rootfs  # noqa: F401 - fixture
from tests.support.gpu_runs import PATH_ENV, need_runtime, node_config
from tests.support.runtimes import RUNTIMES, run_container

#: What the test containers run: the GPU's device node is there, libcuda loads.
GPU_CHECK = "test -c /dev/nvidia0 && echo has-nvidia0 && dlopen-probe libcuda.so.1"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(metadata: str) -> tuple[set[str], set[str]]:
    """The distribution names of ``Requires-Dist``: (runtime, the ``test`` extra's)."""
    runtime, test = set(), set()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            value = line.split(":", 1)[1]
            name = _normal(re.match(r"\s*([A-Za-z0-9._-]+)", value).group(1))
            marker = value.partition(";")[2]
            if not marker:
                runtime.add(name)
            elif re.search(r"extra\s*==\s*['\"]test['\"]", marker):
                test.add(name)
    return runtime, test


class Lean:
    def __init__(self, root: Path, metadata: str):
        self.root, self.metadata = root, metadata
        self.bin = root / "venv" / "bin"
        self.site = root / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    def run(self, *argv, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("env", BUILD_ENV)
        return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd="/", timeout=120,
                              **kwargs)

    def ok(self, *argv, **kwargs) -> subprocess.CompletedProcess:
        proc = self.run(*argv, **kwargs)
        assert proc.returncode == 0, proc.stderr
        return proc


@pytest.fixture(scope="module")
def lean(tmp_path_factory) -> Lean:
    root = tmp_path_factory.mktemp("lean")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "nvct_build.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "nvct", src / "nvct", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src),
                    "-w", str(root / "wheels")], env=BUILD_ENV, cwd="/", check=True, timeout=300, capture_output=True)
    [wheel] = (root / "wheels").glob("nvct-*.whl")
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root / "venv")], env=BUILD_ENV,
                   check=True, timeout=120)
    env = Lean(root, metadata)
    subprocess.run([*pip, "--python", str(env.bin / "python"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   env=BUILD_ENV, cwd="/", check=True, timeout=300, capture_output=True)
    # The runtime requirements' modules, as this machine has them (Debian's python3-* packages).
    owners = importlib.metadata.packages_distributions()
    runtime, _ = _requirements(metadata)
    for module, dists in owners.items():
        if runtime & {_normal(d) for d in dists}:
            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin != "built-in", module
            path = list(spec.submodule_search_locations)[0] if spec.submodule_search_locations else spec.origin
            os.symlink(path, env.site / os.path.basename(path))
    return env


def test_the_wheels_runtime_requirements_leave_out_pyelftools(lean):
    runtime, test = _requirements(lean.metadata)
    assert runtime == {"click", "tomlkit", "python-prctl", "pyyaml"}, sorted(runtime)
    assert "pyelftools" in test  # tests/simulate and tests.support.rootfs check ELF files with it


def test_the_lean_environment_has_the_runtime_requirements_and_no_pyelftools(lean):
    ok = lean.run(lean.bin / "python", "-I", "-c", "import click, tomlkit, yaml, prctl, nvct")
    assert ok.returncode == 0, ok.stderr
    missing = lean.run(lean.bin / "python", "-I", "-c", "import elftools")
    assert "No module named 'elftools'" in missing.stderr, missing.stderr


def test_nvct_and_the_toolkits_host_check_run_without_pyelftools(lean):
    version = lean.run(lean.bin / "nvct", "--version")
    assert version.returncode == 0 and version.stdout.startswith("nvct, version"), version.stderr
    entry = lean.site / "nvct" / "toolkit" / "entry.py"
    check = lean.run(lean.bin / "python", "-I", entry, "nvct", lean.bin / "nvct", "--check")
    assert check.returncode == 0 and check.stdout.startswith("ok: Python"), check.stderr


def test_the_test_helpers_import_without_pyelftools():
    """A GPU node may lack pyelftools: tests.support imports there (rootfs.py reads ELF files only when asked)."""
    code = ("import sys; sys.modules['elftools'] = None\n"
            "import tests.support.rootfs, tests.support.fixtures, tests.support.gpu_runs, tests.support.bundle")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_cdi_generate_without_pyelftools_writes_the_same_spec(lean, sim_node, tmp_path):
    """The same copy of nvct, once where pyelftools cannot be imported, once with it imported first."""
    env = {**BUILD_ENV, "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]}
    args = ["cdi", "generate", "--hook-path", "/usr/bin/nvidia-cdi-hook", "--output"]
    lean.ok(lean.bin / "nvidia-ctk", *args, tmp_path / "lean.yaml", env=env)
    with_elftools = (f"import sys; sys.path.insert(0, {str(lean.site)!r}); import elftools.elf.elffile, nvct; "
                     f"assert nvct.__file__.startswith({str(lean.site)!r}); sys.argv[0] = 'nvidia-ctk'; "
                     "from nvct.programs import ctk; sys.exit(ctk.main())")
    lean.ok("/usr/bin/python3", "-I", "-c", with_elftools, *args, tmp_path / "full.yaml", env=env)
    spec = (tmp_path / "lean.yaml").read_text()
    assert "kind: nvidia.com/gpu" in spec and "/dev/nvidia0" in spec
    assert spec == (tmp_path / "full.yaml").read_text()


@pytest.mark.containers
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_gpu_containers_start_without_pyelftools(lean, sim_node, rootfs, tmp_path, runtime, mode):
    """The shim and the hooks it adds (the legacy hook; nvct's CDI hooks) all come from the lean environment."""
    need_runtime(runtime)
    config = node_config(tmp_path, sim_node, mode=mode, runtime=RUNTIMES[runtime][0])
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", GPU_CHECK],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    result = run_container([str(lean.bin / "nvidia-container-runtime")], bundle,
                           env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": BUILD_ENV["PATH"]})
    assert result.rc == 0 and "has-nvidia0" in result.stdout and "ok libcuda.so.1" in result.stdout, \
        result.describe()
    hooks = [h["path"] for stage in read_config(bundle).get("hooks", {}).values() for h in stage]
    assert hooks and all(p.startswith(f"{lean.bin}/") for p in hooks), hooks
