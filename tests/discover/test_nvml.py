"""nvct's NVML binding: which GPU instances have a graphics (``+gfx``) profile.

Against the simulated node's mock NVML (its RTX PRO 6000 topology: GPU 0 has
GI 1 of 2g.48gb+gfx, GI 5 of 1g.24gb and GI 6 of 1g.24gb+gfx), and against a
stand-in library for a driver whose NVML knows only the v2 profile info.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from nvct.config import file as config_mod
from nvct.discover import nvml as nvml_mod
from nvct.discover.driver import Driver

GFX_TOPOLOGY = os.path.join(os.path.dirname(__file__), "..", "..", "nvct", "simulate", "rtx-pro-6000.json")


def _node(tmp_path_factory, **options):
    if os.geteuid() != 0:
        from tests.support.fixtures import skip

        skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim", **options)


@pytest.fixture(scope="module")
def gfx_driver(tmp_path_factory):
    node = _node(tmp_path_factory, topology=os.path.abspath(GFX_TOPOLOGY))
    return Driver.from_config(config_mod.load(node["config"]))


def _gfx_instances(driver, index):
    with driver.nvml() as nvml:
        return nvml.gfx_gpu_instances(nvml.handle_by_uuid(driver.gpus[index].uuid))


def test_the_graphics_gpu_instances_of_a_mig_gpu(gfx_driver):
    assert _gfx_instances(gfx_driver, 0) == {1, 6}
    assert _gfx_instances(gfx_driver, 1) == frozenset()  # MIG off: no GPU instance at all


def test_a_gpu_without_graphics_profiles_has_none(sim_node):
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    assert driver.gpus[0].migs and _gfx_instances(driver, 0) == frozenset()
    assert driver.mig_gfx == frozenset()


def test_the_driver_knows_them_by_gpu_index_and_gi(gfx_driver):
    assert gfx_driver.mig_gfx == {(0, 1), (0, 6)}
    bus = gfx_driver.gpus[0].bus_id
    assert gfx_driver.drm_links(gfx_driver.gpus[0]) == [
        ("../card0", f"/dev/dri/by-path/pci-{bus}-card"), ("../renderD128", f"/dev/dri/by-path/pci-{bus}-render")]


class _V2OnlyLibrary:
    """NVML of a driver before the v3 profile info: v2 answers, v3 is a version mismatch."""

    def __init__(self, profiles: dict[int, int], instances: dict[int, list[int]]):
        self.profiles, self.instances, self.calls = profiles, instances, []

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle, profile, info):
        struct = info._obj
        self.calls.append(struct.version >> 24)
        if struct.version >> 24 != 2:
            return nvml_mod.ERROR_ARGUMENT_VERSION_MISMATCH
        if profile.value not in self.profiles:
            return nvml_mod.ERROR_NOT_SUPPORTED
        struct.id = self.profiles[profile.value]
        return nvml_mod.SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle, profile_id, out, count):
        ids = self.instances.get(profile_id.value, [])
        for i, gi in enumerate(ids):
            out[i] = 1000 + gi
        count._obj.value = len(ids)
        return nvml_mod.SUCCESS

    def nvmlGpuInstanceGetInfo(self, instance, info):
        info._obj.id = instance.value - 1000
        return nvml_mod.SUCCESS


def test_a_v2_driver_is_read_by_the_profile_constant():
    lib = _V2OnlyLibrary({0: 14, 10: 47, 11: 46}, {14: [5], 47: [6, 4], 46: [1]})
    nvml = nvml_mod.Nvml.__new__(nvml_mod.Nvml)
    nvml._lib, nvml._path = lib, "libnvidia-ml.so.1"
    assert nvml.gfx_gpu_instances(ctypes.c_void_p(1)) == {1, 4, 6}
    assert lib.calls[:2] == [3, 2]  # v3 first, v2 after its mismatch
