"""/proc/driver/nvidia in a real runc container: what libnvidia-container shows, nothing more.

This machine's kernel has no NVIDIA module, so the shim runs in a private mount
namespace whose /proc/driver is the simulated node's, and the container's /proc
is that /proc (an rbind: runc allows it, as the source is procfs). The kernel's
files are then the node's, as on a GPU host.

Legacy mode masks as libnvidia-container does (a read-only tmpfs holding params,
version, registry, the requested GPUs and the requested MIG devices' access
files). jit-cdi and cdi mode leave /proc/driver/nvidia to the kernel, as the
reference's CDI edits do (runc refuses spec mounts under /proc), masking only
params.
"""

from __future__ import annotations

import os

import pytest

from tests.support.gpu_runs import need_runtime, run_gpu

pytestmark = pytest.mark.containers

SHOW = ("cd /proc/driver/nvidia && find . | sort; grep ModifyDeviceFiles params; "
        "touch x 2>/dev/null && echo writable; true")


@pytest.fixture(scope="module")
def mig_node(tmp_path_factory):
    """The default DGX H100 with MIG on GPUs 0 and 2 (two 3g.40gb each)."""
    import json

    from nvct.simulate import cached_node
    from nvct.simulate.topology import DEFAULT_TOPOLOGY

    with open(DEFAULT_TOPOLOGY) as f:
        topology = json.load(f)
    topology["gpus"][2]["mig"] = dict(topology["gpus"][0]["mig"])
    need_runtime("runc")  # root, for the node's device nodes
    return cached_node(tmp_path_factory.getbasetemp() / "sim", topology=topology)


def _private_proc(node) -> list[str]:
    """The shim in a private mount namespace whose /proc/driver is the node's."""
    return ["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
            'mount --bind "$0" /proc/driver && exec "$@"', os.path.join(node["roots"]["proc_root"], "driver")]


def _host_proc(spec: dict) -> None:
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/proc"]
    spec["mounts"].insert(0, {"destination": "/proc", "type": "bind", "source": "/proc",
                              "options": ["rbind", "nosuid", "nodev", "noexec"]})


def _show(tmp_path, node, rootfs, mode, *env, privileged=False, runtime="runc") -> list[str]:
    need_runtime(runtime)
    result = run_gpu(tmp_path, node, rootfs, mode=mode, env=list(env), command=SHOW, privileged=privileged,
                     runtime=runtime, wrapper=_private_proc(node), edit=_host_proc)
    assert result.ok, result.describe()
    return result.stdout.splitlines()


def _gpu_files(node, *indexes) -> list[str]:
    out = ["./gpus"]
    for i in indexes:
        bus = node["gpus"][i]["bus_id"]
        out += [f"./gpus/{bus}", f"./gpus/{bus}/information", f"./gpus/{bus}/registry"]
    return out


def _mig_caps(node, gpu, mig) -> tuple[str, str]:
    m = node["gpus"][gpu]["mig_devices"][mig]
    gi = f"./capabilities/gpu{node['gpus'][gpu]['minor']}/mig/gi{m['gi']}"
    return f"{gi}/access", f"{gi}/ci{m['ci']}/access"


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_legacy_shows_only_the_requested_gpus_and_no_mig_capabilities(tmp_path, mig_node, rootfs, runtime):
    """NVIDIA_VISIBLE_DEVICES=1,3: GPU 0's and 2's MIG trees and mig/{config,monitor} are not there."""
    caps = os.path.join(mig_node["roots"]["proc_root"], "driver/nvidia/capabilities")
    assert os.path.isdir(f"{caps}/gpu0/mig") and os.path.isdir(f"{caps}/gpu2/mig")
    assert os.path.isfile(f"{caps}/mig/config")
    lines = _show(tmp_path, mig_node, rootfs, "legacy", "NVIDIA_VISIBLE_DEVICES=1,3", runtime=runtime)
    files = [line for line in lines if line.startswith(".")]
    assert files == sorted([".", "./params", "./registry", "./version", *_gpu_files(mig_node, 1, 3)])
    assert "ModifyDeviceFiles: 0" in lines and "writable" not in lines


def test_legacy_shows_a_mig_devices_own_access_files(tmp_path, sim_node, rootfs):
    lines = _show(tmp_path, sim_node, rootfs, "legacy", "NVIDIA_VISIBLE_DEVICES=0:1")
    caps = [line for line in lines if line.startswith("./capabilities")]
    gi, ci = _mig_caps(sim_node, 0, 1)
    shown = {gi, ci}
    for path in (gi, ci):
        while os.path.dirname(path) != ".":
            path = os.path.dirname(path)
            shown.add(path)
    assert caps == sorted(shown)  # not the other MIG device's, not mig/{config,monitor}
    assert [line for line in lines if line.startswith("./gpus")] == _gpu_files(sim_node, 0)


def test_legacy_mig_config_shows_the_whole_capabilities_tree(tmp_path, sim_node, rootfs):
    lines = _show(tmp_path, sim_node, rootfs, "legacy", "NVIDIA_VISIBLE_DEVICES=all",
                  "NVIDIA_MIG_CONFIG_DEVICES=all", privileged=True)
    assert {"./capabilities/mig/config", "./capabilities/mig/monitor", *_mig_caps(sim_node, 0, 0)} <= set(lines)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_cdi_modes_leave_proc_to_the_kernel_as_the_reference(tmp_path, mig_node, rootfs, mode, runtime):
    """The reference's CDI edits cannot mount under /proc either: every GPU's files stay visible.
    params is masked by the hook the shim leaves (nvct.modifier.prepare), the chain's other steps done before."""
    lines = _show(tmp_path, mig_node, rootfs, mode, "NVIDIA_VISIBLE_DEVICES=1,3", runtime=runtime)
    assert set(_gpu_files(mig_node, *range(len(mig_node["gpus"])))) <= set(lines)
    assert {"./capabilities/mig/config", *_mig_caps(mig_node, 0, 0), *_mig_caps(mig_node, 2, 1)} <= set(lines)
    assert "ModifyDeviceFiles: 0" in lines


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_an_image_proc_symlink_to_the_host_gets_no_params_mask(tmp_path, sim_node, rootfs, mode, runtime):
    """The image's /proc is a link to a host directory holding a params file: the mask hook must
    not mount through it (the kernel would follow the link from the host's root; the mount would
    land in the container's namespace only, but the start is refused). Host untouched."""
    from tests.security.conftest import snapshot

    need_runtime(runtime)
    host = tmp_path / "host"
    (host / "driver/nvidia").mkdir(parents=True)
    (host / "driver/nvidia/params").write_text("ModifyDeviceFiles: 1\n")
    before = snapshot(host)
    os.rmdir(os.path.join(rootfs, "proc"))
    os.symlink(str(host), os.path.join(rootfs, "proc"))
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="cat /proc/driver/nvidia/params", wrapper=_private_proc(sim_node), edit=_host_proc)
    assert snapshot(host) == before
    assert not result.ok, result.describe()
    if runtime == "runc":  # runc mounts its procfs through the link, inside the root; the mask hook refuses
        assert "reached through a symlink; refusing to mask it" in result.stderr, result.describe()
    else:  # crun refuses the link itself
        assert "proc" in result.stderr, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
def test_lxcfs_files_under_proc_stay_allowed_beside_the_mask(tmp_path, sim_node, rootfs, mode, runtime):
    """The files runc allows under /proc (LXCFS's) are no volume on the driver's path: a GPU container
    keeps them, and its params are masked. Any other mount under /proc is refused
    (tests/security/test_params_mask.py)."""
    need_runtime(runtime)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1024 kB\n")

    def edit(spec: dict) -> None:
        _host_proc(spec)
        spec["mounts"].append({"destination": "/proc/meminfo", "type": "bind", "source": str(meminfo),
                               "options": ["rbind", "ro"]})

    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="cat /proc/meminfo; grep ModifyDeviceFiles /proc/driver/nvidia/params",
                     wrapper=_private_proc(sim_node), edit=edit)
    assert result.ok, result.describe()
    assert result.stdout.splitlines() == ["MemTotal: 1024 kB", "ModifyDeviceFiles: 0"]
