"""What a given NVIDIA driver version installs and reports.

Facts from docs/simulated-node.md's reference (a real driver install): which
libraries exist in which versions, their SONAMEs, links and DT_NEEDED, and
the version strings the kernel module, NVML and CUDA report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvct.base.errors import NvctError

DEFAULT_DRIVER_VERSION = "550.54.15"
MIN_DRIVER_BRANCH = 450

#: CUDA driver API version by driver branch (the greatest branch <= the driver's applies).
_CUDA_BY_BRANCH = {
    450: 11000, 455: 11010, 460: 11020, 465: 11030, 470: 11040, 495: 11050, 510: 11060,
    515: 11070, 520: 11080, 525: 12000, 530: 12010, 535: 12020, 545: 12030, 550: 12040,
    555: 12050, 560: 12060, 565: 12070, 570: 12080, 575: 12090, 580: 13000,
}
_VULKAN_BY_BRANCH = {450: "1.2.133", 470: "1.2.175", 510: "1.3.194", 525: "1.3.224", 535: "1.3.242",
                     545: "1.3.260", 550: "1.3.277", 560: "1.3.289", 570: "1.4.303"}
_EGL_WAYLAND_BY_BRANCH = {450: "1.1.4", 470: "1.1.7", 510: "1.1.9", 525: "1.1.10", 535: "1.1.11",
                          550: "1.1.13", 560: "1.1.16", 570: "1.1.17"}
_EGL_GBM_BY_BRANCH = {495: "1.1.0", 525: "1.1.1", 570: "1.1.2"}
#: Build dates in /proc/driver/nvidia/version for the versions tests use.
_BUILD_DATES = {
    "535.161.08": "Tue Mar  5 22:42:15 UTC 2024",
    "550.54.15": "Tue Mar  5 22:23:56 UTC 2024",
    "570.124.06": "Wed Feb 26 02:22:47 UTC 2025",
}
_DEFAULT_BUILD_DATE = "Mon Jan  8 12:00:00 UTC 2024"
GCC_VERSION = "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)"

X86_64_DIR = "/usr/lib/x86_64-linux-gnu"
I386_DIR = "/usr/lib/i386-linux-gnu"
#: Architectures a node can be built for, and where each puts its libraries (Debian multiarch:
#: NVIDIA's arm64 "sbsa" packages for Ubuntu and Debian install to /usr/lib/aarch64-linux-gnu).
ARCHES = ("x86_64", "aarch64")
LIB_DIRS = {"x86_64": X86_64_DIR, "i386": I386_DIR, "aarch64": "/usr/lib/aarch64-linux-gnu"}


@dataclass(frozen=True)
class Library:
    """One driver library: file ``<name>.so.<version or own>``, SONAME, links."""

    name: str                  # libcuda
    capability: str | None     # libnvidia-container's capability, None if never injected
    soname: str                # "1", "0", "2", "4" or "ver" (the driver version) or "own"
    dev_link: bool = False
    i386: bool = False
    needed: tuple = ()         # other driver libraries (names) or glibc sonames
    subdir: str = ""           # vdpau
    own_version: str = ""      # for soname == "own"


@dataclass(frozen=True)
class Driver:
    """A driver version and everything derived from it."""

    version: str
    branch: int
    cuda_version: int          # 12040

    @property
    def cuda_version_string(self) -> str:
        return f"{self.cuda_version // 1000}.{self.cuda_version % 1000 // 10}"

    @property
    def nvml_version(self) -> str:
        return f"{self.cuda_version // 1000}.{self.version}"

    @property
    def vulkan_api_version(self) -> str:
        return _by_branch(_VULKAN_BY_BRANCH, self.branch)

    @property
    def frontend_name(self) -> str:
        """The /proc/devices name of major 195 (renamed in 550.40)."""
        return "nvidia" if _key(self.version) >= (550, 40) else "nvidia-frontend"

    @property
    def build_date(self) -> str:
        return _BUILD_DATES.get(self.version, _DEFAULT_BUILD_DATE)

    @property
    def has_gsp_firmware(self) -> bool:
        return self.branch >= 510

    def libraries(self) -> list[Library]:
        """The libraries this version installs, in a stable order."""
        b = self.branch
        libs = [
            Library("libnvidia-ml", "utility", "1", dev_link=True, i386=True),
            Library("libnvidia-cfg", "utility", "1", dev_link=True),
            Library("libcuda", "compute", "1", dev_link=True, i386=True,
                    needed=("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")),
            Library("libnvidia-ptxjitcompiler", "compute", "1", dev_link=True, i386=True),
            Library("libnvidia-opencl", "compute", "1", i386=True),
            Library("libnvidia-pkcs11", "compute", "ver") if b >= 525 else None,
            Library("libnvidia-pkcs11-openssl3", "compute", "ver") if b >= 525 else None,
            Library("libnvidia-allocator", "compute", "1", dev_link=True, i386=True) if b >= 460 else None,
            Library("libcudadebugger", "compute", "1") if b >= 520 else None,
            Library("libnvidia-nvvm", "compute", "4", dev_link=True) if b >= 495 else None,
            Library("libnvidia-gpucomp", "compute", "ver", i386=True) if b >= 530 else None,
            Library("libnvidia-compiler", "compute", "ver", i386=True) if b < 530 else None,
            Library("libnvidia-fatbinaryloader", "compute", "ver", i386=True) if b < 450 else None,
            Library("libnvcuvid", "video", "1", dev_link=True, i386=True),
            Library("libnvidia-encode", "video", "1", dev_link=True, i386=True, needed=("libnvcuvid",)),
            Library("libnvidia-opticalflow", "video", "1", dev_link=True, i386=True),
            Library("libvdpau_nvidia", "video", "1", i386=True, subdir="vdpau"),
            Library("libnvidia-eglcore", "graphics", "ver", i386=True),
            Library("libnvidia-glcore", "graphics", "ver", i386=True),
            Library("libnvidia-tls", "graphics", "ver", i386=True),
            Library("libnvidia-glsi", "graphics", "ver", i386=True),
            Library("libnvidia-glvkspirv", "graphics", "ver", i386=True),
            Library("libnvidia-fbc", "graphics", "1", dev_link=True, i386=True),
            Library("libnvidia-ifr", "graphics", "1", i386=True) if b < 470 else None,
            Library("libnvidia-rtcore", "graphics", "ver"),
            Library("libnvidia-cbl", "graphics", "ver") if b < 495 else None,
            Library("libnvoptix", "graphics", "1"),
            Library("libGLX_nvidia", "graphics", "0", i386=True, needed=("libnvidia-glcore", "libnvidia-tls")),
            Library("libEGL_nvidia", "graphics", "0", i386=True, needed=("libnvidia-eglcore", "libnvidia-glsi")),
            Library("libGLESv2_nvidia", "graphics", "2", i386=True, needed=("libnvidia-eglcore",)),
            Library("libGLESv1_CM_nvidia", "graphics", "1", i386=True, needed=("libnvidia-eglcore",)),
            Library("libnvidia-ngx", "ngx", "1") if b >= 470 else None,
            Library("libnvidia-egl-gbm", None, "own", own_version=_by_branch(_EGL_GBM_BY_BRANCH, b))
            if b >= 495 else None,
            Library("libnvidia-egl-wayland", None, "own", own_version=_by_branch(_EGL_WAYLAND_BY_BRANCH, b)),
            # Newer drivers' EGL platform libraries and NVVM 7.0, each with its own version.
            Library("libnvidia-egl-wayland2", None, "own", own_version="1.0.0") if b >= 575 else None,
            Library("libnvidia-egl-xcb", None, "own", own_version="1.0.1") if b >= 560 else None,
            Library("libnvidia-egl-xlib", None, "own", own_version="1.0.1") if b >= 560 else None,
            Library("libnvidia-nvvm70", None, "own", own_version="4") if b >= 570 else None,
            Library("libnvidia-gtk3", None, "ver"),
            Library("libnvidia-wayland-client", None, "ver") if b >= 515 else None,
        ]
        return [lib for lib in libs if lib is not None]

    def file_name(self, lib: Library) -> str:
        if lib.soname == "own":
            return f"{lib.name}.so.{lib.own_version}"
        return f"{lib.name}.so.{self.version}"

    def soname(self, lib: Library) -> str:
        if lib.soname == "ver":
            return f"{lib.name}.so.{self.version}"
        if lib.soname == "own":
            return f"{lib.name}.so.{lib.own_version.split('.')[0]}"
        return f"{lib.name}.so.{lib.soname}"


#: Library names libnvidia-container injects, per capability (it matches
#: ld.so.cache entries named ``<name>.so*`` whose target ends in the version).
CAPABILITY_LIBRARIES = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    "compute": ("libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
                "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator",
                "libnvidia-compiler", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",
                "libnvidia-tileiras"),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": ("libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc",
                 "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix", "libGLX_nvidia", "libEGL_nvidia",
                 "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv", "libnvidia-cbl"),
    "ngx": ("libnvidia-ngx",),
}

#: Binaries in /usr/bin: name -> capability (None: installed, never injected).
BINARIES = {
    "nvidia-smi": "utility",
    "nvidia-debugdump": "utility",
    "nvidia-persistenced": "utility",
    "nv-fabricmanager": "utility",
    "nvidia-cuda-mps-control": "compute",
    "nvidia-cuda-mps-server": "compute",
    "nvidia-imex": "compute",
    "nvidia-imex-ctl": "compute",
}


def driver(version: str) -> Driver:
    """Parse and check a driver version such as ``550.54.15``."""
    if not isinstance(version, str) or not re.match(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$", version):
        raise NvctError(f"driver version {version!r}: expected MAJOR.MINOR[.PATCH] such as 550.54.15")
    branch = int(version.split(".")[0])
    if branch < MIN_DRIVER_BRANCH:
        raise NvctError(f"driver version {version}: simulated drivers start at {MIN_DRIVER_BRANCH}")
    return Driver(version=version, branch=branch, cuda_version=_by_branch(_CUDA_BY_BRANCH, branch))


def _by_branch(table: dict, branch: int):
    return table[max(b for b in table if b <= branch)]


def _key(version: str) -> tuple:
    return tuple(int(x) for x in version.split("."))
