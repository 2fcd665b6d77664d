"""request + driver -> edits, on the simulated node."""

import itertools
import os

import pytest

from nvct.base.errors import NvctError
from nvct.config import file as config_mod
from nvct.discover.driver import Driver
from nvct.edits import build as injection
from nvct.request import container as request_mod
from tests.support.capabilities import CAPABILITIES, expected_library_stems, stem


@pytest.fixture(scope="module")
def setup(sim_node):
    config = config_mod.load(sim_node["config"])
    return config, Driver.from_config(config)


def edits_for(setup, env, **kw):
    config, driver = setup
    req = request_mod.from_env(env, config, **kw)
    return injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct")


def test_gpu_edits_have_nodes_libraries_binaries_and_one_hook(setup, sim_node):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "1"})
    root = sim_node["roots"]["driver_root"]
    paths = [d.path for d in edits.device_nodes]
    assert paths == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                     "/dev/nvidia-modeset"]
    assert all(d.host_path == os.path.join(root, d.path.lstrip("/")) for d in edits.device_nodes)
    mounted = {m.container_path for m in edits.mounts}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in mounted
    assert "/usr/bin/nvidia-smi" in mounted
    assert "/run/nvidia-persistenced/socket" in mounted
    assert "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin" in mounted
    assert all(m.host_path == os.path.join(root, m.container_path.lstrip("/")) for m in edits.mounts)
    assert all("ro" in m.options and "nosuid" in m.options for m in edits.mounts if "lib" in m.container_path)
    [hook] = edits.hooks
    assert hook.hook_name == "createContainer" and hook.path == "/usr/bin/nvct"
    args = list(hook.args)
    assert args[:4] == ["nvct", "hook", "chain", "create-symlinks"]
    assert "libcuda.so.550.54.15::/usr/lib/x86_64-linux-gnu/libcuda.so.1" in args
    assert "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so" in args
    ldcache = args[args.index("update-ldcache"):]
    assert ldcache[:3] == ["update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]
    assert ldcache[-2:] == ["--", "disable-device-node-modification"]
    # every name ldconfig would enter: SONAMEs and unversioned links, once each
    entries = [ldcache[i + 1] for i, a in enumerate(ldcache) if a == "--library"]
    assert {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so"} <= set(entries)
    assert len(entries) == len(set(entries))
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" not in entries


def test_every_edit_says_why(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0:1", "NVIDIA_DRIVER_CAPABILITIES": "all"})
    assert all(e.reason for e in edits.device_nodes + edits.mounts + edits.hooks)
    assert any("MIG device 0:1" in d.reason for d in edits.device_nodes)


def test_graphics_brings_drm_nodes_and_icd_files(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "2", "NVIDIA_DRIVER_CAPABILITIES": "graphics,display"})
    assert {"/dev/dri/card2", "/dev/dri/renderD130"} <= {d.path for d in edits.device_nodes}
    # The node has the ICD under /usr/share; the Vulkan loader finds it in /etc in every image.
    icd = [m for m in edits.mounts if m.container_path == "/etc/vulkan/icd.d/nvidia_icd.json"]
    assert [m.host_path.endswith("/usr/share/vulkan/icd.d/nvidia_icd.json") for m in icd] == [True]


def test_compat32_brings_i386_libraries(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,compat32"})
    assert any(m.container_path.startswith("/usr/lib/i386-linux-gnu/libcuda.so.") for m in edits.mounts)


def test_mig_config_and_imex_channels(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_MIG_CONFIG_DEVICES": "0",
                              "NVIDIA_MIG_MONITOR_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "1"}, privileged=True)
    paths = {d.path for d in edits.device_nodes}
    assert {"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2",
            "/dev/nvidia-caps-imex-channels/channel1"} <= paths


def test_missing_imex_channel_is_an_error(setup):
    from nvct.base.errors import RequestError

    with pytest.raises(RequestError, match="IMEX channel 7 does not exist"):
        edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_IMEX_CHANNELS": "7"})


# --- the hook program: nvct.path, then the reference's nvidia-ctk.path, then nvct's own lookup ---

def _hook_config(**tables) -> config_mod.Config:
    return config_mod.Config({table: {"path": path} for table, path in tables.items()}, env={})


def test_nvct_path_wins_over_nvidia_ctk_path():
    config = _hook_config(**{"nvct": "/opt/nvct/bin/nvct", "nvidia-ctk": "/usr/local/nvidia/toolkit/nvidia-ctk"})
    assert injection.hook_source(config) == ("/opt/nvct/bin/nvct", "nvct.path")


def test_nvidia_ctk_path_names_the_program_and_its_argv():
    config = _hook_config(**{"nvidia-ctk": "/usr/local/nvidia/toolkit/nvidia-ctk"})
    assert injection.hook_source(config) == ("/usr/local/nvidia/toolkit/nvidia-ctk", "nvidia-ctk.path")
    assert injection.chain_prefix("/usr/local/nvidia/toolkit/nvidia-ctk") == ["nvidia-ctk", "hook", "chain"]
    assert injection.chain_prefix("/usr/bin/nvidia-cdi-hook") == ["nvidia-cdi-hook", "chain"]
    assert injection.chain_prefix("/usr/bin/nvct") == ["nvct", "hook", "chain"]
    for prefix in (["nvidia-ctk", "hook", "chain"], ["nvidia-cdi-hook", "chain"], ["nvct", "hook", "chain"]):
        assert injection.chain_steps(prefix + ["update-ldcache"]) == ["update-ldcache"]
    assert injection.chain_steps(["nvidia-ctk", "hook", "update-ldcache"]) is None


def test_the_built_in_bare_nvidia_ctk_leaves_the_choice_to_nvct():
    path, how = injection.hook_source(_hook_config(**{"nvidia-ctk": "nvidia-ctk"}))
    assert os.path.basename(path) == "nvct" and how != "nvidia-ctk.path"


def test_a_bare_name_is_looked_up_on_path_and_a_missing_one_names_its_key(monkeypatch, tmp_path):
    program = tmp_path / "nvidia-cdi-hook"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert injection.hook_source(_hook_config(**{"nvidia-ctk": "nvidia-cdi-hook"})) == (str(program), "nvidia-ctk.path")
    with pytest.raises(NvctError, match=r"^nvidia-ctk.path: 'nvidia-ctk-missing' not found on PATH$"):
        injection.hook_source(_hook_config(**{"nvidia-ctk": "nvidia-ctk-missing"}))


@pytest.fixture(scope="module")
def libraries_on_node(sim_node):
    root = sim_node["roots"]["driver_root"]
    names = set()
    for d in ("usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/vdpau"):
        names |= {stem(n) for n in os.listdir(os.path.join(root, d)) if ".so." in n}
    return names


@pytest.mark.parametrize("caps", [c for n in range(1, len(CAPABILITIES) + 1)
                                  for c in itertools.combinations(CAPABILITIES, n)], ids=",".join)
def test_every_capability_combination_gets_libnvidia_containers_library_sets(setup, libraries_on_node, caps):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": ",".join(caps)})
    injected = {stem(m.container_path) for m in edits.mounts if m.container_path.startswith("/usr/lib/x86_64")}
    assert injected == expected_library_stems(caps, libraries_on_node)
    links = {a.split("::")[1] for a in edits.hooks[0].args if "::" in a}
    # video brings libcuda with its SONAME and .so links; display the graphics libraries
    assert ("/usr/lib/x86_64-linux-gnu/libcuda.so.1" in links) == bool({"compute", "video"} & set(caps))
    assert ("/usr/lib/x86_64-linux-gnu/libGLX_nvidia.so.0" in links) == bool({"graphics", "display"} & set(caps))


def test_video_alone_gets_libcuda_but_not_the_compute_programs(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video"})
    mounted = {m.container_path for m in edits.mounts}
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" in mounted
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-encode.so.550.54.15" in mounted
    assert not any("nvidia-cuda-mps" in p for p in mounted)  # compute *binaries* stay compute's
    assert "enable-cuda-compat" in edits.hooks[0].args


def test_graphics_files_icds_and_links(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "display"})
    mounted = {m.container_path for m in edits.mounts}
    assert {"/etc/vulkan/icd.d/nvidia_icd.json", "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
            "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
            "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15"} <= mounted
    assert "/etc/OpenCL/vendors/nvidia.icd" not in mounted  # compute's
    links = [a for a in edits.hooks[0].args if "::" in a]
    lib = "/usr/lib/x86_64-linux-gnu"
    assert {f"../libnvidia-allocator.so.1::{lib}/gbm/nvidia-drm_gbm.so",
            f"libnvidia-egl-gbm.so.1.1.1::{lib}/libnvidia-egl-gbm.so.1",
            "libglxserver_nvidia.so.550.54.15::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
            f"libGLX_nvidia.so.0::{lib}/libGLX_indirect.so.0"} <= set(links)


def test_compute_gets_the_opencl_icd_and_every_unversioned_link(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility,video"})
    assert "/etc/OpenCL/vendors/nvidia.icd" in {m.container_path for m in edits.mounts}
    links = {a for a in edits.hooks[0].args if "::" in a}
    lib = "/usr/lib/x86_64-linux-gnu"
    for name in ("libcuda", "libnvidia-ml", "libnvcuvid", "libnvidia-encode", "libnvidia-opticalflow",
                 "libnvidia-ptxjitcompiler", "libcudadebugger", "libnvidia-opencl"):
        assert f"{name}.so.1::{lib}/{name}.so" in links, name
    assert f"libnvidia-nvvm.so.4::{lib}/libnvidia-nvvm.so" in links


def test_video_gets_the_vdpau_module_by_the_name_libvdpau_opens(setup):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video"})
    vdpau = "/usr/lib/x86_64-linux-gnu/vdpau"
    assert f"{vdpau}/libvdpau_nvidia.so.550.54.15" in {m.container_path for m in edits.mounts}
    args = edits.hooks[0].args
    assert f"libvdpau_nvidia.so.550.54.15::{vdpau}/libvdpau_nvidia.so.1" in args
    assert not any(a.endswith(f"{vdpau}/libvdpau_nvidia.so") for a in args)


@pytest.mark.parametrize("env, privileged", [
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, False),
    ({"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "all"}, False),
    ({"NVIDIA_VISIBLE_DEVICES": "0:1,2", "NVIDIA_DRIVER_CAPABILITIES": "graphics,display,compute"}, False),
    ({"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_MIG_CONFIG_DEVICES": "0", "NVIDIA_MIG_MONITOR_DEVICES": "all",
      "NVIDIA_IMEX_CHANNELS": "1"}, True),
])
def test_nodes_only_gives_the_same_device_nodes_without_the_files(setup, env, privileged):
    """Legacy's device rules (nvct.modifier.modes.legacy_device_rules): every node, no library discovered."""
    config, driver = setup
    req = request_mod.from_env(env, config, privileged=privileged)
    whole = injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct")
    nodes = injection.container_edits(req, Driver.from_config(config), config, hook_path="/usr/bin/nvct",
                                      nodes_only=True)
    assert nodes.device_nodes == whole.device_nodes and nodes.device_nodes
    assert not nodes.mounts and whole.mounts


# --- graphics MIG profiles (+gfx): the parent's DRM nodes and by-path links ---

GFX_TOPOLOGY = os.path.join(os.path.dirname(__file__), "..", "..", "nvct", "simulate", "rtx-pro-6000.json")


@pytest.fixture(scope="module")
def gfx_setup(tmp_path_factory):
    """The RTX PRO 6000 node: GPU 0's MIG devices 0:0 (2g+gfx, GI 1), 0:1 (1g, GI 5), 0:2 (1g+gfx, GI 6)."""
    if os.geteuid() != 0:
        from tests.support.fixtures import skip

        skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import cached_node

    node = cached_node(tmp_path_factory.getbasetemp() / "sim", topology=os.path.abspath(GFX_TOPOLOGY))
    return config_mod.load(node["config"]), node


def _gfx_edits(gfx_setup, visible, caps="all", **kw):
    config, _ = gfx_setup
    driver = Driver.from_config(config)
    req = request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": visible, "NVIDIA_DRIVER_CAPABILITIES": caps}, config)
    return injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct", **kw), driver


def _link_chains(edits):
    return [h for h in edits.hooks if [s.name for s in getattr(h, "steps", ())] == ["create-symlinks"]]


BUS = "0000:17:00.0"
LINKS = (("../card0", f"/dev/dri/by-path/pci-{BUS}-card"), ("../renderD128", f"/dev/dri/by-path/pci-{BUS}-render"))


@pytest.mark.parametrize("visible", ["0:2", "0:0"])
def test_a_graphics_mig_device_gets_the_parents_drm_nodes_and_a_links_chain_after_nvcts(gfx_setup, visible):
    edits, driver = _gfx_edits(gfx_setup, visible)
    paths = [n.path for n in edits.device_nodes]
    assert "/dev/dri/card0" in paths and "/dev/dri/renderD128" in paths
    assert "/dev/dri/card1" not in paths  # GPU 1's are not the parent's
    assert driver.mig_gfx == {(0, 1), (0, 6)}
    chains = _link_chains(edits)
    assert [c.steps[0].links for c in chains] == [LINKS]
    assert edits.hooks[-1] is chains[0]  # after the main chain, which may end in readonly-root
    assert "graphics profile" in next(n.reason for n in edits.device_nodes if n.path == "/dev/dri/renderD128")


@pytest.mark.parametrize("visible, caps", [("0:1", "all"), ("0:2", "compute,utility")])
def test_no_drm_for_a_compute_mig_device_or_without_graphics(gfx_setup, visible, caps):
    edits, driver = _gfx_edits(gfx_setup, visible, caps)
    assert not [n.path for n in edits.device_nodes if n.path.startswith("/dev/dri")]
    assert _link_chains(edits) == []
    if caps != "all":
        assert "mig_gfx" not in driver.__dict__  # NVML not asked


def test_whole_gpus_never_ask_nvml_for_graphics_profiles(gfx_setup):
    edits, driver = _gfx_edits(gfx_setup, "1")
    assert "/dev/dri/renderD129" in [n.path for n in edits.device_nodes]
    assert "mig_gfx" not in driver.__dict__ and "mig_uuids" not in driver.__dict__


def test_two_graphics_mig_devices_of_one_gpu_share_one_links_chain(gfx_setup):
    edits, _ = _gfx_edits(gfx_setup, "0:0,0:2")
    assert len(_link_chains(edits)) == 1


def test_sandbox_edits_have_drm_nodes_but_no_hook(gfx_setup):
    edits, _ = _gfx_edits(gfx_setup, "0:2", sandbox=True)
    assert "/dev/dri/renderD128" in [n.path for n in edits.device_nodes]
    assert edits.hooks == []


def test_a_gpu_without_drm_nodes_does_not_ask_nvml(gfx_setup, tmp_path):
    config, node = gfx_setup
    driver = Driver.from_config(config)
    driver.dev_root = str(tmp_path)  # no /dev/dri/by-path there
    gpu = driver.gpus[0]
    edits = injection.mig_edits(driver, gpu, gpu.migs[2], ("graphics",), hook_path="/usr/bin/nvct")
    assert edits.hooks == [] and "mig_gfx" not in driver.__dict__


def test_when_nvml_cannot_tell_the_mig_device_still_works_without_drm(gfx_setup, monkeypatch, caplog):
    from nvct.base.errors import DriverError

    config, _ = gfx_setup
    driver = Driver.from_config(config)

    def broken():
        raise DriverError("libnvidia-ml.so.1 not found")

    monkeypatch.setattr(driver, "nvml", broken)
    gpu = driver.gpus[0]
    edits = injection.mig_edits(driver, gpu, gpu.migs[2], ("graphics",), hook_path="/usr/bin/nvct")
    assert [n.path for n in edits.device_nodes][0] == "/dev/nvidia0"
    assert not [n for n in edits.device_nodes if n.path.startswith("/dev/dri")]


@pytest.mark.parametrize("visible", ["0:0", "0:2,1"])
def test_nodes_only_gives_a_graphics_mig_devices_drm_nodes(gfx_setup, visible):
    whole, _ = _gfx_edits(gfx_setup, visible)
    nodes, _ = _gfx_edits(gfx_setup, visible, nodes_only=True)
    assert nodes.device_nodes == whole.device_nodes and "/dev/dri/card0" in [n.path for n in nodes.device_nodes]


# --- whole GPUs with graphics or display: their DRM nodes' by-path links ---

def _links_of(node, *indexes):
    out = []
    for i in indexes:
        bus = node["gpus"][i]["bus_id"]
        out += [(f"../card{i}", f"/dev/dri/by-path/pci-{bus}-card"),
                (f"../renderD{128 + i}", f"/dev/dri/by-path/pci-{bus}-render")]
    return tuple(out)


@pytest.mark.parametrize("caps", ["graphics", "display", "all"])
def test_graphics_gpus_get_one_links_chain_for_exactly_their_drm_nodes(setup, sim_node, caps):
    edits = edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "1,3", "NVIDIA_DRIVER_CAPABILITIES": caps})
    chains = _link_chains(edits)
    assert [c.steps[0].links for c in chains] == [_links_of(sim_node, 1, 3)]
    assert edits.hooks[-1] is chains[0]  # after the main chain, which may end in readonly-root
    assert {n.path for n in edits.device_nodes if n.path.startswith("/dev/dri")} == {
        "/dev/dri/card1", "/dev/dri/renderD129", "/dev/dri/card3", "/dev/dri/renderD131"}


def test_one_gpus_chain_names_it(setup, sim_node):
    [chain] = _link_chains(edits_for(setup, {"NVIDIA_VISIBLE_DEVICES": "2", "NVIDIA_DRIVER_CAPABILITIES": "display"}))
    assert chain.steps[0].links == _links_of(sim_node, 2)
    assert chain.reason == "/dev/dri/by-path links of GPU 2"


def test_a_compute_only_request_reads_no_links_and_gets_no_chain(setup, monkeypatch):
    config, _ = setup
    driver = Driver.from_config(config)

    def no(gpu):
        raise AssertionError("by-path links read for a compute-only request")

    monkeypatch.setattr(driver, "drm_links", no)
    monkeypatch.setattr(driver, "drm_nodes", no)
    req = request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": "1,3", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
                               config)
    edits = injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct")
    assert _link_chains(edits) == [] and len(edits.hooks) == 1


@pytest.mark.parametrize("kw", [{"sandbox": True}, {"nodes_only": True}])
def test_sandbox_and_device_rules_have_the_drm_nodes_but_no_links_chain(setup, kw):
    config, driver = setup
    req = request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "graphics"}, config)
    edits = injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct", **kw)
    assert "/dev/dri/renderD129" in [n.path for n in edits.device_nodes]
    assert _link_chains(edits) == []


@pytest.mark.parametrize("disabled", [("create-symlinks",), ("all",)])
def test_a_disabled_create_symlinks_hook_drops_the_links(setup, disabled):
    from nvct.cdi.features import Generation

    config, driver = setup
    req = request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "graphics"}, config)
    edits = injection.container_edits(req, driver, config, hook_path="/usr/bin/nvct",
                                      generation=Generation(disabled_hooks=disabled))
    assert "/dev/dri/renderD129" in [n.path for n in edits.device_nodes]
    assert not any(step.name == "create-symlinks" for h in edits.hooks for step in getattr(h, "steps", ()))


def test_a_gpu_and_a_graphics_mig_device_share_one_links_chain(gfx_setup):
    edits, _ = _gfx_edits(gfx_setup, "0:2,1", caps="graphics")
    [chain] = _link_chains(edits)
    links = chain.steps[0].links
    assert LINKS[0] in links and LINKS[1] in links and len(links) == 4
