"""What each NVIDIA_DRIVER_CAPABILITIES value puts in a real container, in every mode.

Under runc and crun, legacy and jit-cdi: the driver libraries a container finds
are libnvidia-container's sets for its capabilities (video brings libcuda,
display the graphics libraries) plus the reference toolkit's graphics extras,
with their ICD files and links. A cdi-mode container gets the generated spec,
which serves every capability, as the reference's does.
"""

from __future__ import annotations

import os

import pytest

from tests.support.capabilities import expected_library_stems, stem
from tests.support.gpu_runs import need_runtime, run_gpu

pytestmark = pytest.mark.containers

LIB = "/usr/lib/x86_64-linux-gnu"
#: Prints each section's facts, from inside the container.
SHOW = (f"cd {LIB} && find . -type f -name '*.so.*'; echo '== files'; "
        "for f in /etc/vulkan/icd.d/nvidia_icd.json /etc/OpenCL/vendors/nvidia.icd "
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json /usr/lib/xorg/modules/drivers/nvidia_drv.so; "
        "do [ -f $f ] && echo $f; done; echo '== links'; "
        "for l in libcuda.so libnvidia-ml.so libnvcuvid.so gbm/nvidia-drm_gbm.so libnvidia-egl-gbm.so.1 "
        "vdpau/libvdpau_nvidia.so.1 "
        "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so; do [ -e $l ] && echo $l; done; "
        "echo '== probe'; dlopen-probe libcuda.so.1 libEGL_nvidia.so.0 libnvidia-egl-gbm.so.1 2>&1; true")


def _sections(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"libs": []}
    key = "libs"
    for line in stdout.splitlines():
        if line.startswith("== "):
            key = line[3:]
            out[key] = []
        elif line.strip():
            out[key].append(line.strip())
    return out


@pytest.fixture(scope="module")
def on_node(sim_node):
    root = sim_node["roots"]["driver_root"]
    names = set()
    for d in (LIB, f"{LIB}/vdpau"):
        names |= {stem(n) for n in os.listdir(root + d) if ".so." in n}
    return names


@pytest.mark.parametrize("caps", ["video", "display", "graphics", "utility", "compute,video,graphics"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_container_gets_the_sets_its_capabilities_name(tmp_path, sim_node, rootfs, on_node, runtime, mode, caps):
    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=SHOW,
                     env=["NVIDIA_VISIBLE_DEVICES=0", f"NVIDIA_DRIVER_CAPABILITIES={caps}"])
    assert result.rc == 0, result.describe()
    found = _sections(result.stdout)
    wanted = set(caps.split(","))
    assert {stem(n) for n in found["libs"]} == expected_library_stems(wanted, on_node), result.describe()
    graphics = bool({"graphics", "display"} & wanted)
    cuda = bool({"compute", "video"} & wanted)
    files = set(found["files"])
    assert ("/etc/vulkan/icd.d/nvidia_icd.json" in files) == graphics
    assert ("/usr/lib/xorg/modules/drivers/nvidia_drv.so" in files) == graphics
    assert ("/etc/OpenCL/vendors/nvidia.icd" in files) == cuda
    links = set(found["links"])
    assert ("libcuda.so" in links) == cuda
    assert ("libnvidia-ml.so" in links) == ("utility" in wanted)
    assert ("gbm/nvidia-drm_gbm.so" in links) == graphics  # resolves: the allocator comes along
    assert ("libnvidia-egl-gbm.so.1" in links) == graphics
    assert ("vdpau/libvdpau_nvidia.so.1" in links) == ("video" in wanted)
    probe = found["probe"]
    assert any(line.startswith("ok libcuda.so.1 ") for line in probe) == cuda, result.describe()
    assert any(line.startswith("ok libnvidia-egl-gbm.so.1 ") for line in probe) == graphics, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_cdi_mode_container_gets_every_capabilitys_files_from_the_generated_spec(
        tmp_path, sim_node, rootfs, on_node, runtime):
    """A CDI spec serves any container (as the reference's): display-only still gets compute's files."""
    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="cdi", runtime=runtime, command=SHOW,
                     env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", "NVIDIA_DRIVER_CAPABILITIES=display"])
    assert result.rc == 0, result.describe()
    found = _sections(result.stdout)
    every = expected_library_stems({"utility", "compute", "video", "display", "ngx"}, on_node)
    assert {stem(n) for n in found["libs"]} == every, result.describe()
    assert set(found["files"]) == {"/etc/vulkan/icd.d/nvidia_icd.json", "/etc/OpenCL/vendors/nvidia.icd",
                                   "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
                                   "/usr/lib/xorg/modules/drivers/nvidia_drv.so"}
    assert set(found["links"]) == {"libcuda.so", "libnvidia-ml.so", "libnvcuvid.so", "gbm/nvidia-drm_gbm.so",
                                   "libnvidia-egl-gbm.so.1", "vdpau/libvdpau_nvidia.so.1",
                                   "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so"}
    assert [line.split()[0] for line in found["probe"]] == ["ok", "ok", "ok"], result.describe()
