"""libnvidia-container's capability tables, written out independently of nvct.discover.driver.

From its src/options.h (what each container option turns on) and src/nvc_info.c
(the library lists, GLVND graphics as the toolkit runs it), plus what the reference
toolkit's graphics mounts and CDI specs add. Tests compare nvct's edits, and what
containers see, against these.
"""

from __future__ import annotations

import os

CAPABILITIES = ("utility", "compute", "video", "graphics", "display", "ngx")
# What each capability turns on...
REFERENCE_OPTIONS = {"utility": ("utility",), "compute": ("compute",), "video": ("video", "compute"),
                      "graphics": ("graphics",), "display": ("graphics",), "ngx": ("ngx",)}
# ...and which libraries each list names (GLVND graphics, as the toolkit runs it).
REFERENCE_LISTS = {
    "utility": {"libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"},
    "compute": {"libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
                "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
                "libnvidia-pkcs11-openssl3", "libnvidia-nvvm", "libnvidia-tileiras"},
    "video": {"libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"},
    "graphics": {"libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
                 "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
                 "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-cbl"},
    "ngx": {"libnvidia-ngx"},
}
# The reference toolkit's graphics mounts add these for graphics or display; its CDI specs carry
# every library of the driver version, which nvct gives display containers (docs/capabilities.md).
TOOLKIT_GRAPHICS = {"libnvidia-egl-gbm", "libnvidia-egl-wayland", "libnvidia-egl-wayland2", "libnvidia-egl-xcb",
                    "libnvidia-egl-xlib", "libnvidia-vulkan-producer", "libnvidia-allocator"}
# NVVM 7.0 (its own version, newer drivers), as the toolkit's CDI specs carry it, with compute.
TOOLKIT_COMPUTE = {"libnvidia-nvvm70"}
TOOLKIT_DISPLAY = {"libnvidia-gtk3", "libnvidia-wayland-client"}


def stem(path: str) -> str:
    return os.path.basename(path).split(".so", 1)[0]


def expected_library_stems(caps, on_node) -> set[str]:
    wanted = {name for cap in caps for lst in REFERENCE_OPTIONS[cap] for name in REFERENCE_LISTS[lst]}
    if {"compute", "video"} & set(caps):
        wanted |= TOOLKIT_COMPUTE
    if {"graphics", "display"} & set(caps):
        wanted |= TOOLKIT_GRAPHICS
    if "display" in caps:
        wanted |= TOOLKIT_DISPLAY
    return wanted & on_node
