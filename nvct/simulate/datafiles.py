"""The driver's non-ELF files: ICD/vendor JSON, firmware, IPC sockets.

The JSON files use the driver's own formatting (4-space indent, ``" : "``
separators), since some consumers are picky text-based parsers.
"""

from __future__ import annotations

import json
import os
import socket
import struct

from nvct.simulate.driver import Driver

SOCKETS = ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket")
MPS_DIR = "/tmp/nvidia-mps"

_XORG_OUTPUTCLASS = """Section "OutputClass"
    Identifier "nvidia"
    MatchDriver "nvidia-drm"
    Driver "nvidia"
    Option "AllowEmptyInitialConfiguration"
    ModulePath "/usr/lib/x86_64-linux-gnu/nvidia/xorg"
EndSection
"""


def text_files(drv: Driver) -> dict:
    """Path (relative to the driver root) -> content, for files written verbatim (0644)."""
    vk = drv.vulkan_api_version
    out = {}
    out["usr/share/vulkan/icd.d/nvidia_icd.json"] = _json({
        "file_format_version": "1.0.0",
        "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": vk},
    })
    out["etc/vulkan/implicit_layer.d/nvidia_layers.json"] = _json({
        "file_format_version": "1.0.0",
        "layer": {
            "name": "VK_LAYER_NV_optimus",
            "type": "INSTANCE",
            "library_path": "libGLX_nvidia.so.0",
            "api_version": vk,
            "implementation_version": "1",
            "description": "NVIDIA Optimus layer",
            "functions": {
                "vkGetInstanceProcAddr": "vk_optimusGetInstanceProcAddr",
                "vkGetDeviceProcAddr": "vk_optimusGetDeviceProcAddr",
            },
            "enable_environment": {"__NV_PRIME_RENDER_OFFLOAD": "1"},
            "disable_environment": {"DISABLE_LAYER_NV_OPTIMUS_1": ""},
        },
    })
    out["usr/share/glvnd/egl_vendor.d/10_nvidia.json"] = _icd("libEGL_nvidia.so.0")
    if drv.branch >= 495:
        out["usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json"] = _icd("libnvidia-egl-gbm.so.1")
    out["usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json"] = _icd("libnvidia-egl-wayland.so.1")
    if drv.branch >= 575:
        out["usr/share/egl/egl_external_platform.d/09_nvidia_wayland2.json"] = _icd("libnvidia-egl-wayland2.so.1")
    if drv.branch >= 560:
        out["usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json"] = _icd("libnvidia-egl-xcb.so.1")
        out["usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json"] = _icd("libnvidia-egl-xlib.so.1")
    out["etc/OpenCL/vendors/nvidia.icd"] = "libnvidia-opencl.so.1\n"
    out[f"usr/share/nvidia/nvidia-application-profiles-{drv.version}-rc"] = _json({
        "rules": [
            {"pattern": {"feature": "procname", "matches": "gnome-shell"}, "profile": "CudaNoStablePerfLimit"},
        ],
        "profiles": [
            {"name": "CudaNoStablePerfLimit", "settings": [{"key": "CudaNoStablePerfLimit", "value": True}]},
        ],
    })
    out["usr/share/X11/xorg.conf.d/10-nvidia.conf"] = _XORG_OUTPUTCLASS
    return out


def binary_files(drv: Driver) -> dict:
    """Path -> bytes for data files: the OptiX cache seed and GSP firmware images."""
    out = {"usr/share/nvidia/nvoptix.bin": b"NVOPTIX\0" + drv.version.encode() + b"\0" * 248}
    if drv.has_gsp_firmware:
        for name in firmware_names(drv):
            out[name.lstrip("/")] = _riscv_elf(drv.version)
    return out


def firmware_names(drv: Driver) -> list[str]:
    if not drv.has_gsp_firmware:
        return []
    return [f"/lib/firmware/nvidia/{drv.version}/gsp_ga10x.bin", f"/lib/firmware/nvidia/{drv.version}/gsp_tu10x.bin"]


def make_sockets(root: str) -> None:
    """Leave real AF_UNIX socket files (0666) where the daemons would listen."""
    for path in SOCKETS:
        directory = os.path.join(root, os.path.dirname(path).lstrip("/"))
        os.makedirs(directory, exist_ok=True)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                # Through the directory's fd: sun_path is 108 bytes, node paths can be longer.
                s.bind(f"/proc/self/fd/{dfd}/{os.path.basename(path)}")
        finally:
            os.close(dfd)
        os.chmod(os.path.join(directory, os.path.basename(path)), 0o666)


def _icd(library: str) -> str:
    return _json({"file_format_version": "1.0.0", "ICD": {"library_path": library}})


def _json(data) -> str:
    return json.dumps(data, indent=4, separators=(",", " : ")) + "\n"


def _riscv_elf(version: str) -> bytes:
    """A minimal ELF64 RISC-V image: what the GSP firmware files are, minus the 60 MB."""
    payload = f"NVIDIA GSP-RM firmware {version}\0".encode()
    header = struct.pack("<4sBBBBB7sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, b"\0" * 7,
                         2, 243, 1, 0, 0, 0, 0, 64, 0, 0, 64, 0, 0)
    return header + payload
