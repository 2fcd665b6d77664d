"""nvct against a real NVIDIA driver: discovery, NVML, and GPU containers through the shim in every mode.

The containers' root is a few host libraries, the loader and a CUDA probe
(``cuprobe.c``: libcuda by SONAME, a context and an allocation per GPU), so no
image is needed; the driver's files come in only through nvct.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvct.config import file as config_mod
from nvct.discover import inventory
from nvct.discover.driver import Driver
from tests.support.fixtures import skip
from tests.support.proc import wait_for

BIN = os.path.dirname(sys.executable)
MODES = ("legacy", "jit-cdi", "cdi")
#: The loader and libc that nvidia-smi and the probe need, copied from the host.
_LIBS = ("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
         "/lib/x86_64-linux-gnu/libdl.so.2", "/lib/x86_64-linux-gnu/libpthread.so.0",
         "/lib/x86_64-linux-gnu/librt.so.1")

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/driver/nvidia/version"),
                                reason="needs an NVIDIA kernel module (/proc/driver/nvidia/version)")


def nvidia_smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


def _gpu_names() -> list[str]:
    return [line.strip() for line in nvidia_smi("--query-gpu=name", "--format=csv,noheader").splitlines()]


def _runc() -> str:
    runc = os.environ.get("NVCT_RUNC") or shutil.which("runc")
    if not runc or os.geteuid() != 0:
        skip("needs root and runc (set NVCT_RUNC to a carried runc binary)")
    return runc


def _cuda_probe(tmp_path: Path) -> str:
    """The probe binary: NVCT_CUDA_PROBE (built elsewhere), else built here with cc."""
    if os.environ.get("NVCT_CUDA_PROBE"):
        return os.environ["NVCT_CUDA_PROBE"]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        skip("needs cc to build tests/gpu/cuprobe.c, or NVCT_CUDA_PROBE naming a built one")
    out = str(tmp_path / "cuprobe")
    subprocess.run([cc, "-O2", "-o", out, str(Path(__file__).with_name("cuprobe.c")), "-ldl"], check=True)
    return out


def _rootfs(tmp_path: Path) -> Path:
    rootfs = tmp_path / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "usr/bin", "usr/lib/x86_64-linux-gnu", "lib64",
              "lib/x86_64-linux-gnu"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    for lib in _LIBS:
        if os.path.exists(lib):
            shutil.copy(os.path.realpath(lib), rootfs / lib.lstrip("/"))
    shutil.copy(_cuda_probe(tmp_path), rootfs / "bin/cuprobe")
    (rootfs / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n")
    # An image's own ld cache, which the shim patches early (without one the chain is the hook's).
    subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig", "-r", str(rootfs)], check=True)
    return rootfs


def _config(tmp_path: Path, mode: str, runc: str, base: str = "") -> Path:
    """The shim's config: ``base`` (the node's keys; empty on a real node), the mode and runc,
    and in cdi mode a spec dir holding what ``nvct cdi generate`` writes under that config."""
    config = tmp_path / "config.toml"
    config.write_text(f'{base}\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runc}"]\n')
    if mode == "cdi":
        spec_dir = tmp_path / "cdi"
        spec_dir.mkdir()
        generated = subprocess.run([os.path.join(BIN, "nvct"), "cdi", "generate", "--output",
                                    str(spec_dir / "nvidia.yaml")], capture_output=True, text=True, timeout=120,
                                   env={"PATH": os.environ["PATH"], "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)})
        assert generated.returncode == 0, generated.stderr
        with config.open("a") as f:
            f.write(f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir}"]\n')
    return config


def _bundle(tmp_path: Path, mode: str, args: list[str], capabilities: str) -> tuple[str, dict]:
    """A bundle running ``args`` and asking for every GPU, and the shim's environment for ``mode``."""
    runc = _runc()
    rootfs = _rootfs(tmp_path)
    subprocess.run([runc, "spec", "--bundle", str(tmp_path)], capture_output=True, text=True, check=True)
    spec = json.loads((tmp_path / "config.json").read_text())
    spec["process"].update(terminal=False, args=args,
                           env=["PATH=/usr/local/nvidia/bin:/usr/local/bin:/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all",
                                f"NVIDIA_DRIVER_CAPABILITIES={capabilities}"])
    spec["root"] = {"path": str(rootfs), "readonly": False}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    config = _config(tmp_path, mode, runc)
    return runc, {"PATH": os.environ["PATH"], "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)}


def _run(tmp_path: Path, mode: str, args: list[str], capabilities: str) -> subprocess.CompletedProcess:
    """``args`` through the shim's ``run`` in ``mode``."""
    _, env = _bundle(tmp_path, mode, args, capabilities)
    return subprocess.run([os.path.join(BIN, "nvidia-container-runtime"), "run", "--bundle", str(tmp_path),
                           f"gpu-{mode}-{os.getpid()}"], env=env, capture_output=True, text=True, timeout=120)


def _created(tmp_path: Path, mode: str, args: list[str], capabilities: str) -> str:
    """``args`` through the shim's ``create``, then start and delete, as engines drive a runtime: its output."""
    runc, env = _bundle(tmp_path, mode, args, capabilities)
    name = f"gpu-{mode}-created-{os.getpid()}"
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as f, err.open("w") as e:  # files: the init keeps create's stdio
        created = subprocess.run([os.path.join(BIN, "nvidia-container-runtime"), "create", "--bundle",
                                  str(tmp_path), name], env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=e,
                                 timeout=120)
    assert created.returncode == 0, err.read_text()
    hooks = json.loads((tmp_path / "config.json").read_text()).get("hooks", {}).get("createContainer", [])
    try:
        subprocess.run([runc, "start", name], check=True, timeout=60)
        wait_for(lambda: json.loads(subprocess.run([runc, "state", name], capture_output=True, text=True,
                                                   check=True).stdout)["status"] == "stopped", f"{name} to exit")
    finally:
        subprocess.run([runc, "delete", "--force", name], capture_output=True)
    return f"createContainer hooks: {len(hooks)}\n" + out.read_text()


def test_discovery_matches_nvidia_smi():
    driver = Driver.from_config(config_mod.Config())
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in nvidia_smi("-L").splitlines() if line.startswith("GPU ")]
    assert [g.uuid for g in driver.gpus] == uuids
    assert driver.version == nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader").splitlines()[0].strip()
    sonames = {lib.soname for lib in driver.libraries(["utility", "compute"])}
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= sonames


def test_nvml_binding_on_the_real_library():
    info = inventory.info(Driver.from_config(config_mod.Config()))
    assert info["nvml"] == "ok", info["nvml"]
    assert info["cuda_version"]


def test_generated_spec_names_every_gpu(tmp_path):
    out = tmp_path / "nvidia.json"
    generated = subprocess.run([os.path.join(BIN, "nvct"), "cdi", "generate", "--format", "json", "--output",
                                str(out)], capture_output=True, text=True, timeout=120)
    assert generated.returncode == 0, generated.stderr
    names = {d["name"] for d in json.loads(out.read_text())["devices"]}
    count = len(_gpu_names())
    assert {str(i) for i in range(count)} | {"all"} <= names, names


@pytest.mark.containers
@pytest.mark.parametrize("mode", MODES)
def test_nvidia_smi_in_a_container(tmp_path, mode):
    # The host's nvidia-smi, at its own path inside (a node may keep it in /usr/local/nvidia/bin
    # with a wrapper script in /usr/bin), run through the container's loader.
    smi = os.path.realpath(shutil.which("nvidia-smi") or "/usr/bin/nvidia-smi")
    result = _run(tmp_path, mode, ["/lib64/ld-linux-x86-64.so.2", smi, "-L"], "utility")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == nvidia_smi("-L").strip()


@pytest.mark.containers
@pytest.mark.parametrize("mode", MODES)
def test_cuda_in_a_container(tmp_path, mode):
    """libcuda loads by SONAME inside, sees every GPU by name, and allocates memory on each."""
    result = _run(tmp_path, mode, ["/bin/cuprobe"], "utility,compute")
    assert result.returncode == 0, (result.stdout, result.stderr)
    names = _gpu_names()
    lines = result.stdout.splitlines()
    assert lines[0].startswith("cuda ") and lines[0].endswith(f" devices {len(names)}"), lines
    assert [line.split(" ", 2)[2] for line in lines if line.startswith("device ") and "allocated" not in line] \
        == names
    assert sum(line.endswith(" allocated") for line in lines) == len(names), lines


@pytest.mark.containers
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_a_created_container_is_masked_by_the_shim_with_no_hook(tmp_path, mode):
    """create, start, delete: the shim masks the driver's params itself after the runtime's create
    (no createContainer hook), and CUDA still works inside."""
    out = _created(tmp_path, mode, ["/bin/cuprobe", "/proc/driver/nvidia/params"], "utility,compute")
    lines = out.splitlines()
    assert lines[0] == "createContainer hooks: 0", out
    assert "ModifyDeviceFiles: 0" in lines, out
    assert sum(line.endswith(" allocated") for line in lines) == len(_gpu_names()), out
