"""Generating a spec for a simulated node (needs root: the node's device nodes)."""

from __future__ import annotations

import pytest

from nvct.base.errors import NvctError, RequestError
from nvct.cdi import encoding, generate, modes as cdi_modes, schema, spec, version
from nvct.cdi.registry import Registry
from nvct.request.container import from_env

from .conftest import node_config, node_driver

HOOK = "/opt/nvct/bin/nvct"


def _names(raw):
    return [d["name"] for d in raw["devices"]]


def _device(raw, name):
    return next(d for d in raw["devices"] if d["name"] == name)


def _node_paths(raw, name):
    return [n["path"] for n in _device(raw, name)["containerEdits"]["deviceNodes"]]


def _mig_devices(node):
    return [(g, m) for g in node["gpus"] for m in g["mig_devices"]]


def _expected_names(node, strategies):
    out = {"all"}
    for g in node["gpus"]:
        by = {"index": str(g["index"]), "uuid": g["uuid"], "type-index": f"gpu{g['index']}"}
        out |= {by[s] for s in strategies}
    for g, m in _mig_devices(node):
        by = {"index": f"{g['index']}:{m['index']}", "uuid": m["uuid"],
              "type-index": f"mig{g['index']}:{m['index']}"}
        out |= {by[s] for s in strategies}
    return out


def test_default_spec_has_index_and_uuid_names_for_gpus_and_migs_and_all(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    assert _mig_devices(node), "the default node has MIG devices"
    assert _names(raw) == sorted(_expected_names(node, ["index", "uuid"]))
    assert raw["kind"] == "nvidia.com/gpu"


def test_a_plain_gpu_spec_is_readable_by_cdi_0_5_runtimes(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    assert raw["cdiVersion"] == schema.minimum_version(raw) == "0.5.0"
    assert version.rank(raw["cdiVersion"]) <= version.rank(version.WIDELY_READ)


@pytest.mark.parametrize("strategies", [["type-index"], ["index"], ["uuid", "index", "uuid"]])
def test_naming_strategies(node, strategies):
    raw = generate.generate(node_driver(node), hook_path=HOOK, strategies=strategies)
    assert set(_names(raw)) == _expected_names(node, strategies)
    assert len(_names(raw)) == len(set(_names(raw)))


def test_a_mig_enabled_gpu_gets_its_own_device_with_its_whole_node(node):
    gpu = next(g for g in node["gpus"] if g["mig_enabled"])
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    assert gpu["device_node"] in _node_paths(raw, str(gpu["index"]))
    assert _device(raw, str(gpu["index"])) == {**_device(raw, gpu["uuid"]), "name": str(gpu["index"])}


def test_a_mig_device_has_its_parent_and_its_two_access_nodes(node):
    gpu, mig = _mig_devices(node)[1]
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    assert _node_paths(raw, f"{gpu['index']}:{mig['index']}") == [
        gpu["device_node"], f"/dev/nvidia-caps/nvidia-cap{mig['gi_cap_minor']}",
        f"/dev/nvidia-caps/nvidia-cap{mig['ci_cap_minor']}"]


def test_all_merges_every_device(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    merged = {p for d in raw["devices"] if d["name"] != "all" for p in _node_paths(raw, d["name"])}
    assert set(_node_paths(raw, "all")) == merged
    assert len(_node_paths(raw, "all")) == len(merged)


def test_common_edits_carry_control_nodes_files_hook_and_void(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    common = raw["containerEdits"]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert {n["path"] for n in common["deviceNodes"]} == {
        n["path"] for n in node["device_nodes"] if n["role"] in ("control", "uvm", "modeset")}
    targets = {m["containerPath"] for m in common["mounts"]}
    assert {b["path"] for b in node["binaries"]} <= targets
    assert set(node["firmware"]) <= targets
    assert any(t.endswith(f"libcuda.so.{node['driver_version']}") for t in targets)
    hook, = common["hooks"]
    assert (hook["hookName"], hook["path"], hook["args"][:3]) == ("createContainer", HOOK, ["nvct", "hook", "chain"])


def test_host_paths_lie_under_the_roots_and_container_paths_are_as_on_a_host(node):
    root = node["roots"]["driver_root"]
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    edits = [raw["containerEdits"]] + [d["containerEdits"] for d in raw["devices"]]
    nodes = [n for e in edits for n in e.get("deviceNodes", ())]
    mounts = [m for e in edits for m in e.get("mounts", ())]
    assert nodes and all(n["hostPath"] == root + n["path"] for n in nodes)
    assert mounts and all(m["hostPath"].startswith(root + "/") for m in mounts)
    # Every file where the host has it, but the Vulkan ICD files: the loader reads /etc/vulkan.
    moved = {m["containerPath"]: m["hostPath"][len(root):] for m in mounts
             if m["hostPath"] != root + m["containerPath"]}
    assert moved == {"/etc/vulkan/icd.d/nvidia_icd.json": "/usr/share/vulkan/icd.d/nvidia_icd.json"}
    assert not any(n["path"].startswith(root) for n in nodes)


@pytest.mark.parametrize("ids", [["1"], ["GPU-ID"], ["BUS-ID"]])
def test_device_ids_select_gpus(node, ids):
    gpu = node["gpus"][1]
    ids = [{"GPU-ID": gpu["uuid"], "BUS-ID": gpu["bus_id"]}.get(i, i) for i in ids]
    raw = generate.generate(node_driver(node), hook_path=HOOK, device_ids=ids)
    assert _names(raw) == sorted(["1", gpu["uuid"], "all"])


def test_device_ids_select_a_mig_device(node):
    gpu, mig = _mig_devices(node)[0]
    raw = generate.generate(node_driver(node), hook_path=HOOK, device_ids=[f"{gpu['index']}:{mig['index']}"])
    assert _names(raw) == sorted([f"{gpu['index']}:{mig['index']}", mig["uuid"], "all"])


def test_an_unknown_device_id_is_an_error(node):
    with pytest.raises(RequestError, match="--device-id: unknown device '42'"):
        generate.generate(node_driver(node), hook_path=HOOK, device_ids=["42"])


def test_none_gives_a_none_device_and_no_all(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, device_ids=["none"])
    assert _names(raw) == ["none"]
    assert _device(raw, "none")["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}


def test_no_all_device(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, all_device=False)
    assert "all" not in _names(raw)


def test_management_mode_gives_every_device_node_to_one_device(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, mode="management")
    assert "all" in _names(raw)  # and each GPU's names: tests/cdi/test_management.py
    assert sorted(_node_paths(raw, "all")) == sorted(
        n["path"] for n in node["device_nodes"] if n["role"] != "dri")
    assert "deviceNodes" not in raw["containerEdits"]
    assert raw["containerEdits"]["mounts"]


def test_vendor_and_class(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK, vendor="example.org", cls="accel.v2")
    assert raw["kind"] == "example.org/accel.v2"
    assert raw["cdiVersion"] == "0.6.0"  # a dot in the class


@pytest.mark.parametrize("kwargs, message", [
    ({"vendor": "-bad"}, "invalid CDI kind -bad/gpu"),
    ({"cls": "g/pu"}, "invalid CDI kind nvidia.com/g/pu"),
    ({"mode": "bogus"}, "unknown CDI generate mode 'bogus'"),
    ({"mode": "wsl"}, "WSL2: .*/dev/dxg: No such file"),
    ({"strategies": ["serial"]}, "unknown device name strategy 'serial'"),
])
def test_bad_options(node, kwargs, message):
    with pytest.raises(NvctError, match=message):
        generate.generate(node_driver(node), hook_path=HOOK, **kwargs)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_generated_spec_validates_and_round_trips(node, tmp_path, fmt):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    path = spec.save(raw, str(tmp_path / f"nvidia.{fmt}"), fmt)
    loaded = spec.read(path)
    assert loaded.raw == raw
    assert encoding.dumps(loaded.raw, fmt) == encoding.dumps(raw, fmt)
    assert Registry([str(tmp_path)]).device_names() == sorted(f"nvidia.com/gpu={n}" for n in _names(raw))


def test_resolving_a_generated_device_gives_what_the_node_has(node, tmp_path):
    spec.save(generate.generate(node_driver(node), hook_path=HOOK), str(tmp_path / "nvidia.yaml"), "yaml")
    edits = Registry([str(tmp_path)]).resolve(["nvidia.com/gpu=2"])
    assert "/dev/nvidia2" in [n.path for n in edits.device_nodes]
    assert "/dev/nvidia0" not in [n.path for n in edits.device_nodes]
    assert edits.env == ["NVIDIA_VISIBLE_DEVICES=void"]


def test_automatic_devices_are_generated_for_the_request(node):
    config = node_config(node, {"nvct": {"path": HOOK}})
    req = from_env({"NVIDIA_VISIBLE_DEVICES": "runtime.nvidia.com/gpu=3"}, config)
    edits = cdi_modes.edits_for(req, config)
    paths = [n.path for n in edits.device_nodes]
    assert "/dev/nvidia3" in paths and "/dev/nvidia0" not in paths
    assert edits.hooks[0].path == HOOK


def test_writable_mounts_are_made_by_the_hook_after_every_spec_mount(node):
    """CDI consumers sort spec mounts by depth: the read-write MPS dir would come before the
    libraries and firmware. The hook chain's last step mounts it instead."""
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    edits = [raw["containerEdits"]] + [d["containerEdits"] for d in raw["devices"]]
    mounts = [m for e in edits for m in e.get("mounts", ())]
    assert mounts and all("ro" in m["options"] for m in mounts)
    assert "/tmp/nvidia-mps" not in {m["containerPath"] for m in mounts}
    hook, = raw["containerEdits"]["hooks"]
    assert hook["env"] and hook["args"][-8:] == [
        "--", "bind-mount", "--host-path", node["roots"]["driver_root"] + "/tmp/nvidia-mps",
        "--container-path", "/tmp/nvidia-mps", "--options", "nosuid,nodev,noexec,rbind,rprivate"]
    assert hook["args"].count("bind-mount") == 1


@pytest.mark.parametrize("program, prefix", [
    ("/usr/bin/nvidia-cdi-hook", ["nvidia-cdi-hook", "chain"]),
    ("/usr/bin/nvidia-ctk", ["nvidia-ctk", "hook", "chain"])])
def test_the_mps_step_joins_the_chain_of_any_hook_program(node, program, prefix):
    hook, = generate.generate(node_driver(node), hook_path=program)["containerEdits"]["hooks"]
    assert hook["args"][:len(prefix)] == prefix and hook["args"][len(prefix)] == "check-requirements"
    assert hook["args"][-8:-6] == ["--", "bind-mount"]


def _limits_hooks(edits):
    return [h["args"][h["args"].index("apply-cuda-memory-limits"):] for h in edits.get("hooks", [])
            if h["hookName"] == "createRuntime" and "apply-cuda-memory-limits" in h["args"]]


def test_each_whole_gpu_device_gets_the_memory_limits_hook_as_the_reference(node):
    """The reference (1.20) adds ``apply-cuda-memory-limits --driver-root R --gpu-id UUID`` as a
    createRuntime hook to each GPU's device; ``all`` has them all; MIG devices and the common edits none."""
    driver = node_driver(node)
    raw = generate.generate(driver, hook_path=HOOK)
    root = driver.driver_root
    for g in node["gpus"]:
        want = [["apply-cuda-memory-limits", "--driver-root", root, "--gpu-id", g["uuid"]]]
        assert _limits_hooks(_device(raw, str(g["index"]))["containerEdits"]) == want
        assert _limits_hooks(_device(raw, g["uuid"])["containerEdits"]) == want
    assert len(_limits_hooks(_device(raw, "all")["containerEdits"])) == len(node["gpus"])
    for g, m in _mig_devices(node):
        assert _limits_hooks(_device(raw, f"{g['index']}:{m['index']}")["containerEdits"]) == []
    assert _limits_hooks(raw["containerEdits"]) == []


@pytest.mark.parametrize("mode, disabled", [("auto", ("apply-cuda-memory-limits",)), ("auto", ("all",)),
                                            ("sandbox", ()), ("management", ())])
def test_no_memory_limits_hook_where_hooks_are_off_or_not_per_gpu(node, mode, disabled):
    from nvct.cdi.features import Generation

    raw = generate.generate(node_driver(node), hook_path=HOOK, mode=mode,
                            generation=Generation(disabled_hooks=disabled))
    assert not any(_limits_hooks(d["containerEdits"]) for d in raw["devices"])


# --- graphics MIG profiles (+gfx) ---

@pytest.fixture(scope="module")
def gfx_node(sim_base):
    """RTX PRO 6000 node: GPU 0's MIG devices 0:0 (2g.48gb+gfx), 0:1 (1g.24gb), 0:2 (1g.24gb+gfx)."""
    import os

    from nvct.simulate import cached_node

    if os.geteuid() != 0:
        from tests.support.fixtures import skip

        skip("needs root (the simulated node's device nodes are made with mknod)")
    topology = os.path.join(os.path.dirname(__file__), "..", "..", "nvct", "simulate", "rtx-pro-6000.json")
    return cached_node(sim_base, topology=os.path.abspath(topology))


_BUS = "0000:17:00.0"


def _hook_args(edits):
    return [h["args"] for h in edits.get("hooks", [])]


def test_a_graphics_mig_device_has_the_parents_drm_nodes_and_by_path_links(gfx_node):
    raw = generate.generate(node_driver(gfx_node), hook_path=HOOK)
    migs = gfx_node["gpus"][0]["mig_devices"]
    for mig, name in ((migs[2], "0:2"), (migs[2], migs[2]["uuid"]), (migs[0], "0:0"), (migs[0], migs[0]["uuid"])):
        edits = _device(raw, name)["containerEdits"]
        caps = {f"/dev/nvidia-caps/nvidia-cap{mig[k]}" for k in ("gi_cap_minor", "ci_cap_minor")}
        assert set(_node_paths(raw, name)) == {"/dev/dri/card0", "/dev/dri/renderD128", "/dev/nvidia0", *caps}
        [args] = _hook_args(edits)
        assert args[-4:] == ["--link", f"../card0::/dev/dri/by-path/pci-{_BUS}-card",
                             "--link", f"../renderD128::/dev/dri/by-path/pci-{_BUS}-render"]
        assert "create-symlinks" in args
    assert not any(n["path"].startswith("/dev/dri") for n in raw["containerEdits"]["deviceNodes"])


def test_a_compute_mig_device_has_neither(gfx_node):
    raw = generate.generate(node_driver(gfx_node), hook_path=HOOK)
    mig = gfx_node["gpus"][0]["mig_devices"][1]
    for name in ("0:1", mig["uuid"]):
        assert not [p for p in _node_paths(raw, name) if p.startswith("/dev/dri")]
        assert _hook_args(_device(raw, name)["containerEdits"]) == []


@pytest.mark.parametrize("mode, disabled", [("auto", ("create-symlinks",)), ("auto", ("all",)), ("sandbox", ())])
def test_no_links_hook_where_hooks_are_off(gfx_node, mode, disabled):
    from nvct.cdi.features import Generation

    raw = generate.generate(node_driver(gfx_node), hook_path=HOOK, mode=mode,
                            generation=Generation(disabled_hooks=disabled))
    assert "/dev/dri/renderD128" in _node_paths(raw, "0:2")
    assert _hook_args(_device(raw, "0:2")["containerEdits"]) == []


# --- whole GPUs: their DRM nodes' by-path links ---

def _gpu_links(node, i):
    bus = node["gpus"][i]["bus_id"]
    return ["--link", f"../card{i}::/dev/dri/by-path/pci-{bus}-card",
            "--link", f"../renderD{128 + i}::/dev/dri/by-path/pci-{bus}-render"]


def test_each_gpu_device_has_a_links_hook_for_its_drm_nodes(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    for gpu in node["gpus"][1:]:
        i = gpu["index"]
        for name in (str(i), gpu["uuid"]):
            assert {f"/dev/dri/card{i}", f"/dev/dri/renderD{128 + i}"} <= set(_node_paths(raw, name))
            links = [a for a in _hook_args(_device(raw, name)["containerEdits"]) if "create-symlinks" in a]
            assert [args[args.index("create-symlinks") + 1:] for args in links] == [_gpu_links(node, i)]


def test_all_has_every_gpus_links_in_one_hook(node):
    raw = generate.generate(node_driver(node), hook_path=HOOK)
    [args] = [a for a in _hook_args(_device(raw, "all")["containerEdits"]) if "create-symlinks" in a]
    expected = [x for gpu in node["gpus"] for x in _gpu_links(node, gpu["index"])]
    assert sorted(args[args.index("create-symlinks") + 1:]) == sorted(expected)


@pytest.mark.parametrize("mode, disabled", [("auto", ("create-symlinks",)), ("auto", ("all",)), ("sandbox", ())])
def test_no_gpu_links_hook_where_hooks_are_off(node, mode, disabled):
    from nvct.cdi.features import Generation

    raw = generate.generate(node_driver(node), hook_path=HOOK, mode=mode,
                            generation=Generation(disabled_hooks=disabled))
    for name in ("1", "all"):
        assert "/dev/dri/renderD129" in _node_paths(raw, name)
        assert not [a for a in _hook_args(_device(raw, name)["containerEdits"]) if "create-symlinks" in a]
