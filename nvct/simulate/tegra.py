"""A simulated Jetson (Tegra, L4T r36 / JetPack 6 layout) board: arm64 ELF files and its CSV lists.

A Jetson's integrated GPU has no ``/dev/nvidia*``, no ``/proc/driver/nvidia``
and no NVML: it is ``/dev/nvhost-*`` and ``/dev/nvmap`` (char devices whose
majors the kernel picks), and L4T's CSV files under
``/etc/nvidia-container-runtime/host-files-for-container.d`` list what a GPU
container gets. The libraries are arm64 ELF files cross-compiled here (the
aarch64 node's compiler, :func:`nvct.simulate.native.compiler`) with their
real SONAMEs, under ``/usr/lib/aarch64-linux-gnu/nvidia`` with the links L4T
has; beside them lie files, links and device nodes no list names, which a
container must not get.

DIR/nvct-node.json records the ground truth: ``files`` (node path -> SHA-256
of what a container must see there), ``links`` (node path -> link target),
``devices`` (path -> [major, minor]), ``not_injected`` and
``all_mounts_only`` (what only ``NVIDIA_REQUIRE_JETPACK=csv-mounts=all`` adds).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile

from nvct.base.errors import NvctError
from nvct.simulate import native
from nvct.simulate.manifest import CONFIG, GENERATOR, MANIFEST

LIB = "/usr/lib/aarch64-linux-gnu/nvidia"
SPEC_DIR = "/etc/nvidia-container-runtime/host-files-for-container.d"
#: (path, major, minor): listed device nodes; nvmap is a misc device, nvhost-* get dynamic majors.
DEVICES = (("/dev/nvmap", 10, 125), ("/dev/nvhost-ctrl", 508, 0), ("/dev/nvhost-ctrl-gpu", 505, 0),
           ("/dev/nvhost-prof-gpu", 505, 1), ("/dev/nvhost-gpu", 505, 2), ("/dev/nvhost-as-gpu", 505, 3))
#: Device nodes of the board no list names.
OTHER_DEVICES = (("/dev/nvhost-isp", 507, 0), ("/dev/nvgpu/igpu0/power", 505, 7))
#: (file name, SONAME) of the listed libraries in LIB.
LIBRARIES = (("libcuda.so.1.1", "libcuda.so.1"), ("libnvrm_gpu.so", "libnvrm_gpu.so"),
             ("libnvrm_mem.so", "libnvrm_mem.so"),
             ("libnvidia-ptxjitcompiler.so.540.4.0", "libnvidia-ptxjitcompiler.so.1"))
#: Listed symlinks: path -> target, as L4T installs them.
LINKS = {f"{LIB}/libcuda.so": "libcuda.so.1.1", "/usr/lib/aarch64-linux-gnu/libcuda.so": "nvidia/libcuda.so",
         f"{LIB}/libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so.540.4.0"}
FIRMWARE = "/lib/firmware/nvidia/ga10b"
#: In extra.csv, which only NVIDIA_REQUIRE_JETPACK=csv-mounts=all reads.
EXTRA = f"{LIB}/libnvcudla.so"
UNLISTED = (f"{LIB}/libnvos_unlisted.so", "/usr/lib/aarch64-linux-gnu/libv4l2_nvunlisted.so")
RELEASE = "# R36 (release), REVISION: 4.0, GCID: 00000000, BOARD: generic, EABI: aarch64, DATE: simulated\n"


def build_tegra_node(directory: str | os.PathLike, *, device_nodes: bool = True) -> dict:
    """Build the board at ``directory`` (absent, empty, or a previous one) and return its manifest."""
    target = os.path.abspath(os.fspath(directory))
    if os.path.exists(target) and os.listdir(target):
        if not os.path.exists(os.path.join(target, MANIFEST)):
            raise NvctError(f"{target}: not empty and not a simulated node")
        shutil.rmtree(target)
    if device_nodes and os.geteuid() != 0:
        raise NvctError("building a simulated node with device nodes needs root (mknod); use --no-device-nodes")
    cc = native.compiler("aarch64")
    os.makedirs(target)
    files: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as work:
        for name, soname in LIBRARIES:
            files[f"{LIB}/{name}"] = _put(target, f"{LIB}/{name}", _library(cc, work, name, soname))
        extra = _put(target, EXTRA, _library(cc, work, "libnvcudla.so", "libnvcudla.so"))
        for path in UNLISTED:
            _put(target, path, _library(cc, work, os.path.basename(path), os.path.basename(path)))
    for link, dest in LINKS.items():
        os.symlink(dest, _host(target, link))
    for name in ("gr_fecs.bin", "gr_gpccs.bin"):
        files[f"{FIRMWARE}/{name}"] = _write(target, f"{FIRMWARE}/{name}", b"simulated ga10b firmware " + name.encode())
    _write(target, "/etc/nv_tegra_release", RELEASE.encode())
    _write(target, "/sys/devices/soc0/family", b"Tegra\n")
    files["/etc/nv_tegra_release"] = _sha(RELEASE.encode())
    if os.path.isfile("/sys/devices/soc0/family"):  # mounted only where this kernel's sysfs has the target
        files["/sys/devices/soc0/family"] = _sha(b"Tegra\n")
    csv = {
        "devices.csv": "".join(f"dev, {p}\n" for p, _, _ in DEVICES[:2]) + "dev, /dev/nvhost-*-gpu\n"
                       "dev, /dev/nvhost-gpu\n# a comment, skipped\n",
        "drivers.csv": "".join(f"lib, {LIB}/{n}\n" for n, _ in LIBRARIES)
                       + "".join(f"sym, {p}\n" for p in LINKS) + f"dir, {FIRMWARE}\n"
                       "lib, /usr/lib/aarch64-linux-gnu/nvidia/libmissing.so\n",
        "extra.csv": f"lib, {EXTRA}\n",
    }
    for name, text in csv.items():
        _write(target, f"{SPEC_DIR}/{name}", text.encode())
    devices = {}
    if device_nodes:
        for path, major, minor in DEVICES + OTHER_DEVICES:
            host = _host(target, path)
            os.makedirs(os.path.dirname(host), exist_ok=True)
            os.mknod(host, 0o20666, os.makedev(major, minor))
            os.chmod(host, 0o666)
            if (path, major, minor) in DEVICES:
                devices[path] = [major, minor]
    os.makedirs(os.path.join(target, "proc"), exist_ok=True)
    config = os.path.join(target, CONFIG)
    q = json.dumps
    with open(config, "w") as f:
        f.write(f"# nvct configuration for the simulated Jetson at {q(target)} (`nvct simulate node "
                f"--platform tegra`); set nvidia-container-runtime.mode = \"csv\"\n\n"
                f"[nvidia-container-cli]\nroot = {q(target)}\n\n"
                f"[nvct]\ndev-root = {q(target)}\nproc-root = {q(os.path.join(target, 'proc'))}\n\n"
                f"[nvidia-container-runtime.modes.csv]\nmount-spec-path = {q(_host(target, SPEC_DIR))}\n")
    manifest = {
        "generator": GENERATOR, "platform": "tegra", "arch": "aarch64", "config": config,
        "roots": {"driver_root": target, "dev_root": target, "proc_root": os.path.join(target, "proc")},
        "mount_spec_path": _host(target, SPEC_DIR), "files": files, "links": dict(LINKS), "devices": devices,
        "directories": [FIRMWARE], "all_mounts_only": {EXTRA: extra},
        "not_injected": [*UNLISTED, *(p for p, _, _ in OTHER_DEVICES)],
    }
    with open(os.path.join(target, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def _host(target: str, path: str) -> str:
    return os.path.join(target, path.lstrip("/"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(target: str, path: str, data: bytes) -> str:
    host = _host(target, path)
    os.makedirs(os.path.dirname(host), exist_ok=True)
    with open(host, "wb") as f:
        f.write(data)
    return _sha(data)


def _put(target: str, path: str, built: str) -> str:
    with open(built, "rb") as f:
        data = f.read()
    return _write(target, path, data)


def _library(cc: tuple[str, ...], work: str, name: str, soname: str) -> str:
    symbol = "".join(c if c.isalnum() else "_" for c in name)
    src = os.path.join(work, symbol + ".c")
    with open(src, "w") as f:
        f.write(f'const char *nvct_tegra_{symbol}(void) {{ return "{name}"; }}\n'
                + ("int cuInit(unsigned int flags) { return 0; }\n" if soname == "libcuda.so.1" else ""))
    out = os.path.join(work, name)
    proc = subprocess.run([*cc, "-shared", "-fPIC", "-nostdlib", f"-Wl,-soname,{soname}", "-o", out, src],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise NvctError(f"{' '.join(cc)}: {name}: {proc.stderr.strip()}")
    return out
