"""A simulated WSL2 GPU node: ``/dev/dxg`` and a Windows driver store of real ELF files.

What WSL2 shows a Linux distribution of an NVIDIA GPU: no NVIDIA kernel
module, no ``/dev/nvidia*``; the ``dxg`` device (dxgkrnl, a misc device:
major 10, a minor the kernel picks; here the first dynamic one, 127), the
driver store folders Windows shares under ``/usr/lib/wsl/drivers`` (NVIDIA's
``nv_dispi.inf_amd64_*`` next to other vendors', each also holding Windows
files), and WSL's own ``/usr/lib/wsl/lib``. The ELF files are compiled here
(x86-64), each library with the SONAME the real one has; ``nvidia-smi`` is a
static program that answers ``-L``.

DIR/nvct-node.json records what a container must get (``injected``: node path
-> SHA-256) and what it must not (``not_injected``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile

from nvct.base.errors import NvctError
from nvct.simulate.manifest import CONFIG, GENERATOR, MANIFEST

DXG = (10, 127)
STORE = "usr/lib/wsl/drivers/nv_dispi.inf_amd64_5c8f0e8a1d2b3c4d"
OTHER_STORE = "usr/lib/wsl/drivers/iigd_dch.inf_amd64_0a1b2c3d4e5f6071"
WSL_LIB = "usr/lib/wsl/lib"
GPU = ("NVIDIA GeForce RTX 4090", "GPU-6c1d0e3a-9f2b-4c5d-8e7f-0a1b2c3d4e5f")
#: (folder, file name, SONAME or None for a data file): the NVIDIA store's files a container gets.
_LIBRARIES = (
    (STORE, "libcuda.so.1.1", "libcuda.so.1"),
    (STORE, "libcuda_loader.so", "libcuda_loader.so"),
    (STORE, "libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.1"),
    (STORE, "libnvidia-ml.so.1", "libnvidia-ml.so.1"),
    (STORE, "libnvidia-ml_loader.so", "libnvidia-ml_loader.so"),
    (STORE, "libnvdxgdmal.so.1", "libnvdxgdmal.so.1"),
    (WSL_LIB, "libdxcore.so", "libdxcore.so"),
)
#: Files on the node a container must not get.
_OTHERS = (
    (STORE, "libnvwgf2umx.so", "libnvwgf2umx.so"),  # NVIDIA's D3D user-mode driver: not in the list
    (WSL_LIB, "libd3d12.so", "libd3d12.so"),
    (WSL_LIB, "libcuda.so.1", "libcuda.so.1"),  # WSL's loader stub: the store's is taken
    (OTHER_STORE, "libigdgmm.so.12", "libigdgmm.so.12"),
)
_DATA = ((STORE, "nvcubins.bin", b"NVCUBINS\0simulated\n"), (STORE, "nvapi64.dll", b"MZ\0simulated\n"),
         (OTHER_STORE, "igdumdim64.dll", b"MZ\0simulated\n"))


def build_wsl_node(directory: str | os.PathLike, *, device_nodes: bool = True) -> dict:
    """Build the node at ``directory`` (absent or empty) and return its manifest."""
    target = os.path.abspath(os.fspath(directory))
    if os.path.exists(target) and os.listdir(target):
        if not os.path.exists(os.path.join(target, MANIFEST)):
            raise NvctError(f"{target}: not empty and not a simulated node")
        for name in ("usr", "dev", "proc", "etc", CONFIG, MANIFEST):
            path = os.path.join(target, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
    if device_nodes and os.geteuid() != 0:
        raise NvctError("building a simulated node with device nodes needs root (mknod); "
                        "use --no-device-nodes")
    os.makedirs(target, exist_ok=True)
    injected: dict[str, str] = {}
    others: list[str] = []
    with tempfile.TemporaryDirectory() as work:
        for folder, name, soname in _LIBRARIES:
            path = _put(target, folder, name, _library(work, name, soname))
            injected[path] = _sha(target, path)
        for folder, name, soname in _OTHERS:
            others.append(_put(target, folder, name, _library(work, name, soname)))
        smi = _put(target, STORE, "nvidia-smi", _smi(work), mode=0o755)
        injected[smi] = _sha(target, smi)
    for folder, name, data in _DATA:
        full = os.path.join(target, folder, name)
        with open(full, "wb") as f:
            f.write(data)
        path = "/" + folder + "/" + name
        if name == "nvcubins.bin":
            injected[path] = _sha(target, path)
        else:
            others.append(path)
    os.makedirs(os.path.join(target, "dev"), exist_ok=True)
    os.makedirs(os.path.join(target, "proc"), exist_ok=True)
    os.makedirs(os.path.join(target, "etc/ld.so.conf.d"), exist_ok=True)
    with open(os.path.join(target, "etc/ld.so.conf.d/ld.wsl.conf"), "w") as f:
        f.write("/usr/lib/wsl/lib\n")  # as WSL writes it
    if device_nodes:
        os.mknod(os.path.join(target, "dev/dxg"), 0o20666, os.makedev(*DXG))
        os.chmod(os.path.join(target, "dev/dxg"), 0o666)
    config = os.path.join(target, CONFIG)
    q = json.dumps
    with open(config, "w") as f:
        f.write(f"# nvct configuration for the simulated WSL2 node at {q(target)} (`nvct simulate node "
                f"--platform wsl`)\n\n[nvidia-container-cli]\nroot = {q(target)}\n\n"
                f"[nvct]\ndev-root = {q(target)}\nproc-root = {q(os.path.join(target, 'proc'))}\n")
    manifest = {
        "generator": GENERATOR, "platform": "wsl", "arch": "x86_64", "config": config,
        "roots": {"driver_root": target, "dev_root": target, "proc_root": os.path.join(target, "proc")},
        "dxg": list(DXG) if device_nodes else None, "driver_store": "/" + STORE,
        "gpus": [{"model": GPU[0], "uuid": GPU[1]}],
        "injected": injected, "not_injected": sorted(others), "nvidia_smi_link": "/usr/bin/nvidia-smi",
    }
    with open(os.path.join(target, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def _put(target: str, folder: str, name: str, built: str, mode: int = 0o644) -> str:
    os.makedirs(os.path.join(target, folder), exist_ok=True)
    dst = os.path.join(target, folder, name)
    shutil.copyfile(built, dst)
    os.chmod(dst, mode)
    return "/" + folder + "/" + name


def _sha(target: str, path: str) -> str:
    with open(os.path.join(target, path.lstrip("/")), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _library(work: str, name: str, soname: str) -> str:
    symbol = "".join(c if c.isalnum() else "_" for c in name)
    src = os.path.join(work, symbol + ".c")
    with open(src, "w") as f:
        f.write(f'const char *nvct_wsl_{symbol}(void) {{ return "{name}"; }}\n'
                + ("int cuInit(unsigned int flags) { return 0; }\n" if soname == "libcuda.so.1" else "")
                + ("int nvmlInit_v2(void) { return 0; }\n" if soname == "libnvidia-ml.so.1" else ""))
    out = os.path.join(work, name)
    _cc(["-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", out, src])
    return out


def _smi(work: str) -> str:
    src = os.path.join(work, "smi.c")
    with open(src, "w") as f:
        f.write('#include <stdio.h>\n#include <string.h>\n'
                'int main(int argc, char **argv) {\n'
                '  if (argc > 1 && strcmp(argv[1], "-L") == 0) {\n'
                f'    printf("GPU 0: {GPU[0]} (UUID: {GPU[1]})\\n"); return 0; }}\n'
                '  printf("simulated WSL2 nvidia-smi\\n"); return 0; }\n')
    out = os.path.join(work, "nvidia-smi")
    _cc(["-static", "-O1", "-o", out, src])
    return out


def _cc(args: list[str]) -> None:
    try:
        proc = subprocess.run(["gcc", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise NvctError("building a simulated WSL2 node needs gcc") from None
    if proc.returncode != 0:
        raise NvctError(f"gcc {' '.join(args)}: {proc.stderr.strip()}")
