"""Whole GPUs asked for with ``graphics`` or ``display`` get udev's ``/dev/dri/by-path`` links.

Vulkan/EGL device selection, libdrm's ``drmGetDevices`` and compositors find a GPU's
DRM nodes by ``/dev/dri/by-path/pci-<bus id>-card|render``; the reference's
create-symlinks hook makes them for the DRM nodes it injects. On the simulated DGX
H100 node (GPU N: ``cardN``, ``renderD(128+N)``, DRM major 226), inside real runc and
crun containers in every mode: the links of exactly the requested GPUs exist, name
the right nodes (by their numbers) and open past the device cgroup (the simulated
nodes have no DRM driver: ENXIO, never EPERM); a compute-only request gets no
``/dev/dri`` at all where capabilities choose the edits (legacy, jit-cdi).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support.gpu_runs import MODES, need_runtime, run_gpu

pytestmark = pytest.mark.containers

#: Each by-path link: what it names, and the numbers (hex major:minor) of the node it resolves to;
#: whether each opens past the cgroup; then everything under /dev/dri.
PROBE = ('for l in /dev/dri/by-path/*; do [ -L "$l" ] && echo "$l -> $(readlink "$l") $(stat -L -c %t:%T "$l")"; '
         'done; for n in /dev/dri/by-path/*; do [ -e "$n" ] || continue; '
         'if err=$( (: <"$n") 2>&1); then echo "open $n"; else case $err in *"not permitted"*) '
         'echo "denied $n";; *) echo "open $n";; esac; fi; done; find /dev/dri 2>/dev/null | sort; true')


def _expected(node, indexes) -> list[str]:
    lines, opened, found = [], [], []
    for gpu in sorted((node["gpus"][i] for i in indexes), key=lambda g: g["bus_id"]):
        i, bus = gpu["index"], gpu["bus_id"]
        card, render = f"/dev/dri/by-path/pci-{bus}-card", f"/dev/dri/by-path/pci-{bus}-render"
        lines += [f"{card} -> ../card{i} e2:{i:x}", f"{render} -> ../renderD{128 + i} e2:{128 + i:x}"]
        opened += [f"open {card}", f"open {render}"]
        found += [card, render, f"/dev/dri/card{i}", f"/dev/dri/renderD{128 + i}"]
    return lines + opened + sorted(["/dev/dri", "/dev/dri/by-path", *found])


def _run(tmp_path, node, rootfs, runtime, mode, visible, caps, name):
    result = run_gpu(tmp_path, node, rootfs, runtime=runtime, mode=mode, name=name,
                     env=[f"NVIDIA_VISIBLE_DEVICES={visible}", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
                     command=PROBE)
    assert result.ok, result.describe()
    return result.stdout.splitlines()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_graphics_gpus_get_exactly_their_by_path_links(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    assert _run(tmp_path, sim_node, rootfs, runtime, mode, "1,3", "graphics", "graphics") == \
        _expected(sim_node, [1, 3])
    assert _run(tmp_path, sim_node, rootfs, runtime, mode, "2", "display", "display") == _expected(sim_node, [2])


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_compute_only_request_gets_no_dri(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    assert _run(tmp_path, sim_node, rootfs, runtime, mode, "1,3", "compute,utility", "compute") == []


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_all_gpus_in_cdi_mode(tmp_path, sim_node, rootfs, runtime):
    """The generated spec's ``all``: every GPU's links, made by one hook."""
    need_runtime(runtime)
    everything = range(len(sim_node["gpus"]))
    assert _run(tmp_path, sim_node, rootfs, runtime, "cdi", "all", "graphics", "all") == \
        _expected(sim_node, everything)


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_read_only_root_gets_the_links_and_stays_read_only(tmp_path, sim_node, rootfs, runtime, mode):
    """The links' chain runs after nvct's main chain, whose last step makes a read-only root read-only
    under crun: /dev is the runtime's own tmpfs, still writable."""
    need_runtime(runtime)
    bus = sim_node["gpus"][1]["bus_id"]
    result = run_gpu(tmp_path, sim_node, rootfs, runtime=runtime, mode=mode,
                     env=["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=graphics"],
                     command=f"readlink /dev/dri/by-path/pci-{bus}-render; touch /probe 2>&1 || echo read-only",
                     edit=lambda spec: spec["root"].update(readonly=True))
    assert result.ok, result.describe()
    assert result.stdout.splitlines()[0] == "../renderD129"
    assert result.stdout.splitlines()[-1] == "read-only"


DISABLED = '[nvidia-container-runtime.modes.jit-cdi]\nnvcdi-disable-hooks = ["create-symlinks"]\n'


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_disabled_create_symlinks_hook_makes_no_links(tmp_path, sim_node, rootfs, runtime):
    """jit-cdi with ``create-symlinks`` disabled: the DRM nodes, no links."""
    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, runtime=runtime, mode="jit-cdi",
                     env=["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=graphics"],
                     command="find /dev/dri | sort",
                     extra_config=DISABLED)
    assert result.ok, result.describe()
    assert result.stdout.split() == ["/dev/dri", "/dev/dri/card1", "/dev/dri/renderD129"]


@pytest.mark.parametrize("mode, caps", [("jit-cdi", "graphics"), ("cdi", "compute,utility"), ("cdi", "graphics")])
def test_the_links_ride_on_the_hook_a_prepared_start_keeps(tmp_path, sim_node, rootfs, mode, caps):
    """Start cost: the shim still writes the libraries' links and ld cache before the runtime, and the /dev
    links (the runtime's tmpfs: only the hook can) join the one hook that masks the params. In cdi mode
    every start of a GPU device has them (the spec's device does not know the capabilities)."""
    need_runtime("runc")
    bus = sim_node["gpus"][1]["bus_id"]
    result = run_gpu(tmp_path, sim_node, rootfs, runtime="runc", mode=mode, name="links",
                     env=["NVIDIA_VISIBLE_DEVICES=1", f"NVIDIA_DRIVER_CAPABILITIES={caps}"],
                     command=f"readlink /dev/dri/by-path/pci-{bus}-render")
    assert result.ok, result.describe()
    assert result.stdout.split() == ["../renderD129"]
    with open(os.path.join(tmp_path, "links", "config.json")) as f:
        [hook] = json.load(f)["hooks"]["createContainer"]  # what the runtime ran
    steps = [a for a in hook["args"] if a in ("update-ldcache", "disable-device-node-modification", "create-symlinks")]
    assert steps == ["disable-device-node-modification", "create-symlinks"], hook["args"]
    assert "--container-root" in hook["args"]
