"""nvct against a real NVIDIA driver: discovery, NVML, and a GPU container through the shim."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from nvct.config import file as config_mod
from nvct.discover import inventory
from nvct.discover.driver import Driver
from tests.support.fixtures import skip

BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/driver/nvidia/version"),
                                reason="needs an NVIDIA kernel module (/proc/driver/nvidia/version)")


def nvidia_smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True).stdout


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


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_gpu_container_through_the_shim(tmp_path, mode):
    runc = shutil.which("runc") or os.environ.get("NVCT_RUNC")
    if not runc or os.geteuid() != 0:
        skip("needs root and runc (set NVCT_RUNC to a carried runc binary)")
    rootfs = tmp_path / "rootfs"
    for d in ("bin", "dev", "proc", "sys", "etc", "tmp", "usr/lib/x86_64-linux-gnu", "lib64", "lib/x86_64-linux-gnu"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    # A host-library rootfs: the loader, libc and what libcuda needs, plus the host's static ldconfig.
    for lib in ("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libdl.so.2", "/lib/x86_64-linux-gnu/libpthread.so.0",
                "/lib/x86_64-linux-gnu/librt.so.1"):
        if os.path.exists(lib):
            shutil.copy(os.path.realpath(lib), rootfs / lib.lstrip("/"))
    (rootfs / "etc/ld.so.conf").write_text("/usr/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n")
    spec = json.loads(subprocess.run([runc, "spec", "--bundle", str(tmp_path)], capture_output=True, text=True,
                                     check=True).stdout or (tmp_path / "config.json").read_text())
    spec["process"].update(terminal=False, args=["/usr/bin/nvidia-smi", "-L"],
                           env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all",
                                "NVIDIA_DRIVER_CAPABILITIES=utility"])
    spec["root"] = {"path": str(rootfs), "readonly": False}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    config = tmp_path / "config.toml"
    config.write_text(f'[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runc}"]\n')
    result = subprocess.run([os.path.join(BIN, "nvidia-container-runtime"), "run", "--bundle", str(tmp_path),
                             f"gpu-{mode}"],
                            env={"PATH": os.environ["PATH"], "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == nvidia_smi("-L").strip()
