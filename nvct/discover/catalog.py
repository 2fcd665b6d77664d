"""What an NVIDIA driver ships, by name: the files libnvidia-container's lists pick, per capability.

Data only (discovery finds these under the driver root: nvct.discover.driver);
one place to compare with the reference's lists.
"""

from __future__ import annotations

NVIDIA_MAJOR = 195
CTL_MINOR = 255
MODESET_MINOR = 254

#: Libraries per capability, as libnvidia-container's lists (names up to ".so").
LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": (
        "libcuda.so", "libcudadebugger.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so", "libnvidia-fatbinaryloader.so", "libnvidia-allocator.so",
        "libnvidia-compiler.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so", "libnvidia-tileiras.so",
    ),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": (
        "libnvidia-eglcore.so", "libnvidia-glcore.so", "libnvidia-tls.so", "libnvidia-glsi.so",
        "libnvidia-fbc.so", "libnvidia-ifr.so", "libnvidia-rtcore.so", "libnvoptix.so",
        "libGLX_nvidia.so", "libEGL_nvidia.so", "libGLESv2_nvidia.so", "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so", "libnvidia-cbl.so",
    ),
    "ngx": ("libnvidia-ngx.so",),
}


BINARIES: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl"),
}
BIN_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")

#: Sockets and dirs of the driver's daemons (container path = host path).
IPC = {
    "utility": ("/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"),
    "compute": ("/tmp/nvidia-mps",),
}

#: Which library lists a requested capability turns on, as libnvidia-container's container
#: options do: ``video`` also the compute libraries (NVENC and NVDEC load libcuda),
#: ``display`` also the graphics ones. ``display`` names the reference toolkit's extras.
LIBRARY_SETS: dict[str, tuple[str, ...]] = {
    "utility": ("utility",), "compute": ("compute",), "video": ("video", "compute"),
    "graphics": ("graphics",), "display": ("graphics", "display"), "ngx": ("ngx",),
}

#: Libraries the reference toolkit adds to libnvidia-container's lists (its graphics mounts,
#: and its CDI specs, which carry every ``*.so.*``). The EGL platform libraries and NVVM 7.0
#: (``libnvidia-nvvm70.so.4``, newer drivers) have their own versions; libnvidia-allocator is
#: what ``gbm/nvidia-drm_gbm.so`` points at.
EXTRA_LIBRARIES: dict[str, tuple[str, ...]] = {
    "compute": ("libnvidia-nvvm70.so",),
    "graphics": ("libnvidia-egl-gbm.so", "libnvidia-egl-wayland.so", "libnvidia-egl-wayland2.so",
                 "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so", "libnvidia-vulkan-producer.so",
                 "libnvidia-allocator.so"),
    "display": ("libnvidia-gtk3.so", "libnvidia-wayland-client.so"),
}
OWN_VERSION_LIBRARIES = ("libnvidia-egl-gbm.so", "libnvidia-egl-wayland.so", "libnvidia-egl-wayland2.so",
                         "libnvidia-egl-xcb.so", "libnvidia-egl-xlib.so", "libnvidia-nvvm70.so")

#: Config and data files found under /etc, else /usr/share (the reference's config dirs),
#: per library set: (name, where it goes in the container; None: the path it was found at).
CONFIG_DIRS = ("/etc", "/usr/share")
CONFIG_FILES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "compute": (("OpenCL/vendors/nvidia.icd", None),),
    "graphics": (
        ("glvnd/egl_vendor.d/10_nvidia.json", None),
        ("egl/egl_external_platform.d/15_nvidia_gbm.json", None),
        ("egl/egl_external_platform.d/10_nvidia_wayland.json", None),
        ("egl/egl_external_platform.d/09_nvidia_wayland2.json", None),
        ("egl/egl_external_platform.d/20_nvidia_xcb.json", None),
        ("egl/egl_external_platform.d/20_nvidia_xlib.json", None),
        ("nvidia/nvoptix.bin", None),
        ("X11/xorg.conf.d/10-nvidia.conf", None),
        ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", None),
        # The Vulkan loader reads /etc/vulkan on every distribution: always put them there.
        ("vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/icd.d/nvidia_icd.json"),
        ("vulkan/icd.d/nvidia_icd.x86_64.json", "/etc/vulkan/icd.d/nvidia_icd.x86_64.json"),
        ("vulkan/icd.d/nvidia_layers.json", "/etc/vulkan/icd.d/nvidia_layers.json"),
        ("vulkan/implicit_layer.d/nvidia_layers.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json"),
    ),
}

#: The X server's driver modules (graphics and display), each taken from the first directory
#: that has it: under the driver's library directory, then the distributions' module dirs.
XORG_FILES = ("nvidia_drv.so", "libglxserver_nvidia.so.{version}")
XORG_SUBDIRS = ("modules/drivers", "modules/extensions", "modules/updates/drivers", "modules/updates/extensions")
XORG_ROOTS = ("/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64")


def library_sets(capabilities) -> set[str]:
    """The library lists (keys of :data:`LIBRARIES`, :data:`EXTRA_LIBRARIES`) ``capabilities`` turn on."""
    return {s for cap in capabilities for s in LIBRARY_SETS.get(cap, ())}


#: Debian's multiarch folder of each architecture (as the ld cache names it) NVIDIA ships a driver for.
MULTIARCH = {"x86_64": "x86_64-linux-gnu", "i386": "i386-linux-gnu", "aarch64": "aarch64-linux-gnu",
             "ppc64": "powerpc64le-linux-gnu"}
#: The 32-bit libraries a driver of each architecture also ships (``compat32``): none on arm64.
COMPAT32 = {"x86_64": "i386"}
COMPAT32_ARCHES = frozenset(COMPAT32.values())


def vdpau_dirs(arch: str) -> tuple[str, ...]:
    """Where libvdpau looks for its drivers (modules outside the ld cache) on an ``arch`` node."""
    return (f"/usr/lib/{MULTIARCH.get(arch, arch + '-linux-gnu')}/vdpau", "/usr/lib64/vdpau", "/usr/lib/vdpau")


#: Every architecture's VDPAU folders (a library there is a VDPAU module, whatever the node).
VDPAU_DIRS = tuple(dict.fromkeys(d for arch in MULTIARCH for d in vdpau_dirs(arch)))
