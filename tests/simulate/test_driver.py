from __future__ import annotations

import pytest

from nvct.base.errors import NvctError
from nvct.simulate.driver import driver


@pytest.mark.parametrize("version, cuda, cuda_string, nvml, frontend", [
    ("535.161.08", 12020, "12.2", "12.535.161.08", "nvidia-frontend"),
    ("550.54.15", 12040, "12.4", "12.550.54.15", "nvidia"),
    ("550.40.07", 12040, "12.4", "12.550.40.07", "nvidia"),
    ("550.39", 12040, "12.4", "12.550.39", "nvidia-frontend"),
    ("570.124.06", 12080, "12.8", "12.570.124.06", "nvidia"),
    ("580.65.06", 13000, "13.0", "13.580.65.06", "nvidia"),
    ("470.256.02", 11040, "11.4", "11.470.256.02", "nvidia-frontend"),
])
def test_version_facts(version, cuda, cuda_string, nvml, frontend):
    d = driver(version)
    assert (d.cuda_version, d.cuda_version_string, d.nvml_version, d.frontend_name) == (
        cuda, cuda_string, nvml, frontend)


def names(version):
    return {lib.name for lib in driver(version).libraries()}


@pytest.mark.parametrize("lib, first", [
    ("libnvidia-gpucomp", 530), ("libnvidia-nvvm", 495), ("libcudadebugger", 520), ("libnvidia-pkcs11", 525),
    ("libnvidia-pkcs11-openssl3", 525), ("libnvidia-ngx", 470), ("libnvidia-allocator", 460),
    ("libnvidia-wayland-client", 515), ("libnvidia-egl-gbm", 495),
])
def test_libraries_appear_from_their_first_branch(lib, first):
    before, since = f"{first - 5}.10.01", f"{first}.10.01"
    assert lib not in names(before)
    assert lib in names(since)


@pytest.mark.parametrize("lib, last", [("libnvidia-compiler", 525), ("libnvidia-ifr", 465), ("libnvidia-cbl", 490)])
def test_libraries_gone_after_their_last_branch(lib, last):
    assert lib in names(f"{last}.10.01")
    assert lib not in names("550.54.15")


def test_soname_and_file_names():
    d = driver("550.54.15")
    libs = {lib.name: lib for lib in d.libraries()}
    assert d.file_name(libs["libcuda"]) == "libcuda.so.550.54.15"
    assert d.soname(libs["libcuda"]) == "libcuda.so.1"
    assert d.soname(libs["libnvidia-nvvm"]) == "libnvidia-nvvm.so.4"
    assert d.soname(libs["libGLESv2_nvidia"]) == "libGLESv2_nvidia.so.2"
    assert d.soname(libs["libnvidia-glcore"]) == "libnvidia-glcore.so.550.54.15"
    assert d.file_name(libs["libnvidia-egl-wayland"]) == "libnvidia-egl-wayland.so.1.1.13"
    assert d.soname(libs["libnvidia-egl-wayland"]) == "libnvidia-egl-wayland.so.1"


@pytest.mark.parametrize("bad", ["", "550", "abc.1.2", "550.54.15.1", "1.2.3", "440.100"])
def test_bad_versions_are_rejected(bad):
    with pytest.raises(NvctError, match="driver version"):
        driver(bad)
