"""A graphics MIG device (``+gfx`` profile) gets its parent's DRM nodes and by-path links.

On the simulated RTX PRO 6000 node (nvct/simulate/rtx-pro-6000.json) GPU 0 has
MIG devices 0:0 (2g.48gb+gfx), 0:1 (1g.24gb) and 0:2 (1g.24gb+gfx). Inside real
runc and crun containers, in every mode: a graphics MIG device's container has
``/dev/dri/card0``, ``renderD128`` and the ``by-path`` links to them, and they
open past the device cgroup (the simulated nodes have no DRM driver: ENXIO, never
EPERM); a compute-only MIG device's container has no ``/dev/dri`` at all.
"""

from __future__ import annotations

import os

import pytest

from tests.support.gpu_runs import MODES, need_runtime, run_gpu

pytestmark = pytest.mark.containers

TOPOLOGY = os.path.join(os.path.dirname(__file__), "..", "..", "nvct", "simulate", "rtx-pro-6000.json")
BUS = "0000:17:00.0"
#: What /dev/dri holds, where each by-path link points, and whether each node opens past the cgroup.
PROBE = ('find /dev/dri 2>/dev/null | sort; '
         'for l in /dev/dri/by-path/*; do [ -L "$l" ] && echo "$l -> $(readlink "$l")"; done; '
         'for n in /dev/dri/renderD128 /dev/dri/card0 /dev/dri/by-path/*; do [ -e "$n" ] || continue; '
         'if err=$( (: <"$n") 2>&1); then echo "open $n"; else case $err in *"not permitted"*) '
         'echo "denied $n";; *) echo "open $n";; esac; fi; done; true')


@pytest.fixture(scope="module")
def gfx_node(tmp_path_factory):
    if os.geteuid() != 0:
        from tests.support.fixtures import skip

        skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim", topology=os.path.abspath(TOPOLOGY))


def _run(tmp_path, node, rootfs, runtime, mode, visible, name):
    result = run_gpu(tmp_path, node, rootfs, runtime=runtime, mode=mode, name=name,
                     env=[f"NVIDIA_VISIBLE_DEVICES={visible}", "NVIDIA_DRIVER_CAPABILITIES=all"], command=PROBE)
    assert result.ok, result.describe()
    return result.stdout.splitlines()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_graphics_mig_device_has_its_parents_drm_nodes_and_links_and_a_compute_one_none(
        tmp_path, gfx_node, rootfs, runtime, mode):
    need_runtime(runtime)
    migs = gfx_node["gpus"][0]["mig_devices"]
    assert [m["gfx"] for m in migs] == [True, False, True]
    out = _run(tmp_path, gfx_node, rootfs, runtime, mode, migs[2]["uuid"], "gfx")
    assert out == [
        "/dev/dri", "/dev/dri/by-path", f"/dev/dri/by-path/pci-{BUS}-card", f"/dev/dri/by-path/pci-{BUS}-render",
        "/dev/dri/card0", "/dev/dri/renderD128",
        f"/dev/dri/by-path/pci-{BUS}-card -> ../card0", f"/dev/dri/by-path/pci-{BUS}-render -> ../renderD128",
        "open /dev/dri/renderD128", "open /dev/dri/card0",
        f"open /dev/dri/by-path/pci-{BUS}-card", f"open /dev/dri/by-path/pci-{BUS}-render",
    ]
    assert _run(tmp_path, gfx_node, rootfs, runtime, mode, "0:1", "compute") == []


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_by_index_in_jit_cdi(tmp_path, gfx_node, rootfs, runtime):
    """``0:0`` (2g.48gb+gfx) by its index, the same nodes and links."""
    need_runtime(runtime)
    out = _run(tmp_path, gfx_node, rootfs, runtime, "jit-cdi", "0:0", "gfx")
    assert f"/dev/dri/by-path/pci-{BUS}-render -> ../renderD128" in out
    assert "open /dev/dri/renderD128" in out


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_read_only_root_gets_the_links_and_stays_read_only(tmp_path, gfx_node, rootfs, runtime, mode):
    """The links' chain runs after nvct's main chain, whose last step makes a read-only root
    read-only under crun: /dev is the runtime's own tmpfs, still writable."""
    need_runtime(runtime)
    result = run_gpu(tmp_path, gfx_node, rootfs, runtime=runtime, mode=mode,
                     env=["NVIDIA_VISIBLE_DEVICES=0:2", "NVIDIA_DRIVER_CAPABILITIES=graphics"],
                     command=f"readlink /dev/dri/by-path/pci-{BUS}-render; touch /probe 2>&1 || echo read-only",
                     edit=lambda spec: spec["root"].update(readonly=True))
    assert result.ok, result.describe()
    assert result.stdout.splitlines()[0] == "../renderD128"
    assert result.stdout.splitlines()[-1] == "read-only"
