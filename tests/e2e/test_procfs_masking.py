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


def _proc_linked_to_the_host(tmp_path, rootfs):
    """The image's /proc a link to a host directory holding a params file: whether that directory is untouched."""
    from tests.security.conftest import snapshot

    host = tmp_path / "host"
    (host / "driver/nvidia").mkdir(parents=True)
    (host / "driver/nvidia/params").write_text("ModifyDeviceFiles: 1\n")
    before = snapshot(host)
    os.rmdir(os.path.join(rootfs, "proc"))
    os.symlink(str(host), os.path.join(rootfs, "proc"))
    return lambda: snapshot(host) == before


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_an_image_proc_symlink_to_the_host_gets_no_params_mask(tmp_path, sim_node, rootfs, mode, runtime):
    """The image's /proc is a link to a host directory holding a params file: the mask hook must
    not mount through it (the kernel would follow the link from the host's root; the mount would
    land in the container's namespace only, but the start is refused). Host untouched."""
    need_runtime(runtime)
    untouched = _proc_linked_to_the_host(tmp_path, rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="cat /proc/driver/nvidia/params", wrapper=_private_proc(sim_node), edit=_host_proc)
    assert untouched()
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


# -- a create (docker, containerd, podman): the mask by the shim after the runtime's create, no hook --

def _create_start(tmp_path, node, rootfs, mode, runtime, command, *, edit=_host_proc, root=None,
                  env=("NVIDIA_VISIBLE_DEVICES=0",)):
    """create, start and delete through the shim, as an engine runs it (--pid-file); (result, the spec run)."""
    import json

    from tests.support.bundle import edit_config, make_bundle
    from tests.support.gpu_runs import PATH_ENV, SHIM, node_config
    from tests.support.runtimes import RUNTIMES, create_start_delete

    need_runtime(runtime)
    config = node_config(tmp_path, node, mode=mode, runtime=RUNTIMES[runtime][0])
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh", "-c", command],
                         env=[PATH_ENV, *env])
    with edit_config(bundle) as spec:
        edit(spec)
    result = create_start_delete([*_private_proc(node), SHIM], bundle, root=root,
                                 env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                      "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                                 log_file=str(tmp_path / "bundle.log.json"))
    with open(os.path.join(bundle, "config.json")) as f:
        return result, json.load(f)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_a_create_masks_the_params_without_a_hook(tmp_path, sim_node, rootfs, mode, runtime):
    """An engine's create: the spec the runtime ran has no createContainer hook (no second Python
    start), and the container's params read ModifyDeviceFiles: 0 (nvct.modifier.prepare.Plan.after_create)."""
    result, spec = _create_start(tmp_path, sim_node, rootfs, mode, runtime,
                                 "grep ModifyDeviceFiles /proc/driver/nvidia/params; ls /dev/nvidia0")
    assert result.ok, result.describe()
    assert result.stdout.splitlines() == ["ModifyDeviceFiles: 0", "/dev/nvidia0"], result.describe()
    assert not (spec.get("hooks") or {}).get("createContainer"), spec.get("hooks")


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_a_create_writes_the_dev_links_joined_to_the_mask(tmp_path, sim_node, rootfs, mode, runtime):
    """A graphics GPU's /dev/dri/by-path links (the runtime's /dev: joined to the mask's hook) are the
    shim's after the create too: exactly those of tests/e2e/test_drm_links.py, and no hook."""
    from tests.e2e.test_drm_links import PROBE, _expected

    result, spec = _create_start(tmp_path, sim_node, rootfs, mode, runtime,
                                 PROBE + "; grep ModifyDeviceFiles /proc/driver/nvidia/params",
                                 env=("NVIDIA_VISIBLE_DEVICES=1,3", "NVIDIA_DRIVER_CAPABILITIES=graphics"))
    assert result.ok, result.describe()
    assert result.stdout.splitlines() == [*_expected(sim_node, [1, 3]), "ModifyDeviceFiles: 0"], result.describe()
    assert not (spec.get("hooks") or {}).get("createContainer"), spec.get("hooks")


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_a_run_keeps_the_mask_hook(tmp_path, sim_node, rootfs, mode, runtime):
    """``run`` starts the process at once: the mask stays the hook's."""
    import json

    need_runtime(runtime)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="grep ModifyDeviceFiles /proc/driver/nvidia/params", wrapper=_private_proc(sim_node),
                     edit=_host_proc)
    assert result.ok and result.stdout == "ModifyDeviceFiles: 0\n", result.describe()
    with open(tmp_path / "bundle/config.json") as f:
        [hook] = json.load(f)["hooks"]["createContainer"]
    assert "disable-device-node-modification" in hook["args"]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_a_failed_mask_after_create_leaves_no_container(tmp_path, sim_node, rootfs, mode, runtime):
    """The image's /proc is a link to a host directory holding a params file (runc mounts its procfs through
    it; crun refuses the link itself): the create fails with one line, the container is deleted, the host
    file untouched."""
    import subprocess

    from tests.support.runtimes import RUNTIMES

    untouched = _proc_linked_to_the_host(tmp_path, rootfs)
    state = tmp_path / "state"
    state.mkdir()
    result, _ = _create_start(tmp_path, sim_node, rootfs, mode, runtime, "cat /proc/driver/nvidia/params",
                              root=str(state))
    assert untouched()
    assert not result.ok, result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    if runtime == "runc":
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("nvidia-container-runtime: "), result.describe()
        assert "reached through a symlink; refusing to mask it" in lines[0], result.describe()
        assert "deleted" in lines[0], result.describe()
    listed = subprocess.run([RUNTIMES[runtime][0], "--root", str(state), "list", "-q"], capture_output=True,
                            text=True, timeout=30)
    assert listed.stdout.split() == [], listed


def _attack_cases():
    from tests.security.test_params_mask import KINDS, PLACES

    for place in PLACES:
        for runtime in ("runc", "crun"):
            for mode in ("jit-cdi", "cdi"):
                for kind in KINDS if (runtime, place) == ("crun", "chain") else ("file",):
                    yield pytest.param(kind, place, mode, runtime, id=f"{kind}-{place}-{mode}-{runtime}")


@pytest.mark.parametrize("kind, place, mode, runtime", _attack_cases())
def test_a_create_never_masks_a_host_file_through_a_proc_volume(tmp_path, sim_node, rootfs, kind, place, mode,
                                                                 runtime):
    """tests/security/test_params_mask.py's volumes, through a create: /proc/driver in a volume whose params
    is a host file (or a link to one), the root rshared on a host whose / is shared. The shim refuses what
    the spec and image show; the volume reached through an earlier volume's link (crun allows it) is
    refused by the mask itself, run after the create: the host's namespace shows no mount, the files
    are unchanged, and the create fails."""
    from tests.security import test_params_mask as hostile
    from tests.support.bundle import edit_config, make_bundle
    from tests.support.gpu_runs import PATH_ENV, SHIM, node_config
    from tests.support.runtimes import RUNTIMES, create_start_delete

    need_runtime(runtime)
    host, source = hostile._host(tmp_path, kind, place)
    if place == "redirect":
        os.symlink("/proc/driver", os.path.join(rootfs, "data"))
    volumes = hostile._volumes(place, host, source)
    report = str(tmp_path / "report")
    config = node_config(tmp_path, sim_node, mode=mode, runtime=RUNTIMES[runtime][0])
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["cat", "/proc/driver/nvidia/params"],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    with edit_config(bundle) as spec:
        spec["linux"]["rootfsPropagation"] = "shared"
        if place == "proc":
            spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/proc"]
        spec["mounts"] += volumes
    result = create_start_delete([*hostile._systemd_host(host, report), SHIM], bundle,
                                 env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ.get("PATH", "")})
    hostile._assert_host_untouched(report)
    assert not result.ok and "Traceback" not in result.stderr, result.describe()
    if place == "chain" and runtime == "crun":  # only the mask can see it: after the create, by the shim
        want = "not on the kernel's procfs (a volume?)" if kind == "file" else "reached through a symlink"
        assert f"{want}; refusing to mask it" in result.stderr and "deleted" in result.stderr, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_the_mask_after_create_goes_only_into_the_root_verified_on_the_host(tmp_path, sim_node, rootfs, mode,
                                                                            runtime):
    """The runtime lost the race against root.path's owner (tests/security/test_root_swap.py): stood in for
    by an engine's createContainer hook that mounts a host root over root.path (the runtime's /dev and /proc
    in it, so the runtime goes on). The container's root is
    then that directory: the shim refuses it, after the create, by the identity it verified on the host;
    nothing is mounted in the host root, and no container is left."""
    import subprocess

    from tests.security.conftest import snapshot
    from tests.support.gpu_runs import PATH_ENV
    from tests.support.rootfs import make_rootfs
    from tests.support.runtimes import RUNTIMES

    host = make_rootfs(tmp_path, name="host")
    before = snapshot(host)
    script = 'for d in dev proc; do mount --rbind "$1/$d" "$0/$d" || exit 1; done; mount --rbind "$0" "$1"'
    over = {"path": "/bin/sh", "args": ["sh", "-c", script, host, rootfs], "env": [PATH_ENV]}

    def edit(spec: dict) -> None:
        _host_proc(spec)
        spec.setdefault("hooks", {}).setdefault("createContainer", []).insert(0, over)

    state = tmp_path / "state"
    state.mkdir()
    result, spec = _create_start(tmp_path, sim_node, rootfs, mode, runtime, "true", edit=edit, root=str(state))
    assert spec["hooks"]["createContainer"] == [over]  # nvct's mask is the shim's
    assert not result.ok, result.describe()
    assert "another directory there than the one verified on the host" in result.stderr, result.describe()
    assert snapshot(host) == before
    listed = subprocess.run([RUNTIMES[runtime][0], "--root", str(state), "list", "-q"], capture_output=True,
                            text=True, timeout=30)
    assert listed.stdout.split() == [], listed


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_create_without_a_pid_file_finds_the_init_by_the_runtimes_state(tmp_path, sim_node, rootfs, runtime):
    """No --pid-file (a hand-run create): the init's pid comes from ``<runtime> state``."""
    import json
    import subprocess

    from tests.support.bundle import edit_config, make_bundle
    from tests.support.gpu_runs import PATH_ENV, SHIM, node_config
    from tests.support.runtimes import RUNTIMES

    need_runtime(runtime)
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=RUNTIMES[runtime][0])
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh", "-c", "grep ModifyDeviceFiles "
                                                            "/proc/driver/nvidia/params > /result"],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    with edit_config(bundle) as spec:
        _host_proc(spec)
    state = tmp_path / "state"
    state.mkdir()
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    base = [*_private_proc(sim_node), SHIM, "--root", str(state)]
    try:
        with open(tmp_path / "stderr", "w") as err:  # the init holds it: no pipe to wait on
            created = subprocess.run([*base, "create", "--bundle", bundle, "c1"], env=env, cwd=bundle, timeout=60,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        assert created.returncode == 0, (tmp_path / "stderr").read_text()
        with open(os.path.join(bundle, "config.json")) as f:
            assert not (json.load(f).get("hooks") or {}).get("createContainer")
        subprocess.run([*base, "start", "c1"], env=env, timeout=60, check=True)
        for _ in range(3000):  # polled: the container's end
            shown = subprocess.run([RUNTIMES[runtime][0], "--root", str(state), "state", "c1"], capture_output=True,
                                   text=True, timeout=30)
            if json.loads(shown.stdout or "{}").get("status") == "stopped":
                break
        with open(os.path.join(rootfs, "result")) as f:
            assert f.read() == "ModifyDeviceFiles: 0\n"
    finally:
        subprocess.run([RUNTIMES[runtime][0], "--root", str(state), "delete", "--force", "c1"], capture_output=True,
                       timeout=30)
