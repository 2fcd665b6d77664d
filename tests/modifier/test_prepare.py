"""nvct.modifier.prepare: the hook chain's links and ld cache written by the shim, the params mask left to the hook.

What containers see is checked end to end in tests/e2e (every jit-cdi and cdi
start through the shim goes this way); here, the plan's decisions and the
mask hook the shim leaves, run as a runtime runs it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from nvct.config import file as config_mod
from nvct.discover import ldcache
from nvct.discover.driver import Driver
from nvct.edits import build as injection
from nvct.edits.model import Mount
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.modifier import prepare
from nvct.request import container as request_mod
from tests.support.proc import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the image's ld cache by ldconfig -r, mounts)")

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def setup(sim_node, tmp_path):
    """(config, edits of a GPU 0 jit-cdi container, a fresh image root with its own ld cache, a bundle)."""
    from tests.support.rootfs import make_rootfs

    config = config_mod.load(sim_node["config"])
    driver = Driver.from_config(config)
    edits = injection.container_edits(request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": "0"}, config),
                                      driver, config, hook_path="/usr/bin/nvct")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    return config, edits, make_rootfs(str(tmp_path)), str(bundle)


def _plan(setup, spec=None):
    config, edits, rootfs, bundle = setup
    return prepare.plan(spec or {"mounts": []}, edits, rootfs, bundle, config.proc_root)


def test_the_chain_becomes_the_params_mask_and_the_files_are_written(setup, sim_node):
    config, edits, rootfs, bundle = setup
    plan = _plan(setup)
    assert plan is not None
    plan.edit(edits)
    plan.write()
    [hook] = edits.hooks
    assert (hook.hook_name, hook.path) == ("createContainer", "/usr/bin/nvct")
    assert hook.args == ("nvct", "hook", "chain", "--container-root", rootfs, "disable-device-node-modification")
    assert hook.env and all(not e.startswith(("LD_", "PYTHON")) for e in hook.env)
    assert os.listdir(bundle) == []  # the mask reads the container's own params: nothing in the bundle
    version = sim_node["driver_version"]
    assert os.readlink(os.path.join(rootfs, LIBDIR.lstrip("/"), "libcuda.so.1")) == f"libcuda.so.{version}"
    cached = {e.key: e.value for e in ldcache.load(os.path.join(rootfs, "etc/ld.so.cache"))}
    assert cached["libcuda.so.1"] == f"{LIBDIR}/libcuda.so.1"
    assert cached["libnvidia-ml.so"] == f"{LIBDIR}/libnvidia-ml.so"
    conf = open(os.path.join(rootfs, "etc/ld.so.conf.d/00-nvct-driver.conf")).read()
    assert LIBDIR in conf


def test_an_images_own_link_at_a_link_path_is_replaced_not_a_reason_to_stop(setup, sim_node):
    """A stub's libcuda.so.1 link (or a restarted container's) is where a link goes, not a volume."""
    _, edits, rootfs, _ = setup
    link = os.path.join(rootfs, LIBDIR.lstrip("/"), "libcuda.so.1")
    os.symlink("/usr/local/cuda/lib64/stubs/libcuda.so", link)
    plan = _plan(setup)
    assert plan is not None
    plan.edit(edits)
    plan.write()
    assert os.readlink(link) == f"libcuda.so.{sim_node['driver_version']}"


def test_an_unknown_step_leaves_the_chain_to_the_hook(setup):
    _, edits, _, _ = setup
    [hook] = edits.hooks
    edits.hooks[0] = hook.replace(args=(*hook.args, "--", "chmod", "--mode", "755", "--path", "/dev/dri"))
    assert _plan(setup) is None


def test_a_malformed_step_is_left_to_the_hook_to_report(setup):
    _, edits, _, _ = setup
    [hook] = edits.hooks
    edits.hooks[0] = hook.replace(args=(*hook.args, "--", "create-symlinks", "stray"))
    assert _plan(setup) is None


def test_an_update_ldcache_step_without_library_names_is_left_to_ldconfig(setup):
    _, edits, _, _ = setup
    [hook] = edits.hooks
    args = list(hook.args)
    edits.hooks[0] = hook.replace(args=tuple(a for i, a in enumerate(args)
                                             if a != "--library" and args[i - 1] != "--library"))
    assert _plan(setup) is None


@pytest.mark.parametrize("destination", ["/usr/lib/x86_64-linux-gnu", "/etc", "/usr"])
def test_a_volume_over_a_written_path_leaves_the_chain_to_the_hook(setup, destination):
    spec = {"mounts": [{"destination": destination, "type": "bind", "source": "/srv/volume"}]}
    assert _plan(setup, spec) is None
    assert _plan(setup, {"mounts": [{"destination": "/etc/hosts", "type": "bind", "source": "/x"}]}) is not None


def test_a_volume_an_image_symlink_leads_onto_counts_too(setup):
    _, _, rootfs, _ = setup
    os.rename(os.path.join(rootfs, "etc"), os.path.join(rootfs, "data-etc"))
    os.symlink("data-etc", os.path.join(rootfs, "etc"))
    assert _plan(setup, {"mounts": [{"destination": "/data-etc", "type": "bind", "source": "/srv/v"}]}) is None


def test_an_image_without_an_ld_cache_is_left_to_ldconfig(setup):
    _, _, rootfs, _ = setup
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))
    assert _plan(setup) is None


def test_a_newer_cuda_compat_libcuda_is_left_to_ldconfig(setup):
    _, _, rootfs, _ = setup
    compat = os.path.join(rootfs, "usr/local/cuda/compat")
    os.makedirs(compat)
    open(os.path.join(compat, "libcuda.so.999.1.2"), "w").close()
    assert _plan(setup) is None
    os.rename(os.path.join(compat, "libcuda.so.999.1.2"), os.path.join(compat, "libcuda.so.100.1.2"))
    assert _plan(setup) is not None  # older than the driver: nothing for compat to do


def test_a_bind_mount_step_becomes_the_last_mount(setup, sim_node):
    config, edits, rootfs, bundle = setup
    [hook] = edits.hooks
    mps = os.path.join(sim_node["roots"]["driver_root"], "tmp/nvidia-mps")
    edits.hooks[0] = hook.replace(args=(*hook.args, "--", "bind-mount", "--host-path", mps,
                                        "--container-path", "/tmp/nvidia-mps", "--options", "nosuid,nodev,rbind"))
    plan = _plan(setup)
    plan.edit(edits)
    assert edits.mounts[-1] == Mount(mps, "/tmp/nvidia-mps", "bind", ("nosuid", "nodev", "rbind"),
                                     reason=edits.mounts[-1].reason)


def test_a_bind_mount_steps_target_counts_as_a_volume(setup, sim_node):
    """cdi mode's MPS dir comes last: links an image symlink leads under it would be hidden."""
    _, edits, rootfs, _ = setup
    libdir = os.path.join(rootfs, LIBDIR.lstrip("/"))
    os.rename(libdir, os.path.join(rootfs, "tmp/libs"))
    os.symlink("/tmp/libs", libdir)
    [hook] = edits.hooks
    edits.hooks[0] = hook.replace(args=(*hook.args, "--", "bind-mount", "--host-path", "/srv/mps",
                                        "--container-path", "/tmp"))
    assert _plan(setup) is None


def test_no_driver_params_no_mask_hook(setup, tmp_path):
    config, edits, rootfs, bundle = setup
    plan = prepare.plan({"mounts": []}, edits, rootfs, bundle, str(tmp_path / "no-proc"))
    plan.edit(edits)
    assert edits.hooks == []


STATE = '{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/b"}'


def _hook(root) -> list[str]:
    """The mask hook the shim leaves (Plan.edit), as the runtime runs it."""
    from tests.support.gpu_runs import NVCT

    return [NVCT, "hook", "chain", "--container-root", str(root), "disable-device-node-modification"]


def _mask(root, source=None, state=STATE) -> subprocess.CompletedProcess:
    """The hook as a runtime runs it: the OCI state on stdin."""
    return subprocess.run(_hook(root), input=state, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def _syscall(pid: int) -> list[str]:
    """The syscall ``pid`` is blocked in, and its arguments (empty if it has gone)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split()
    except OSError:
        return []


def test_the_mask_script_reads_the_whole_state_before_it_exits(tmp_path):
    """crun fails a start whose hook exits before it has written the state (seen as exit code -33)."""
    (tmp_path / "root/proc").mkdir(parents=True)
    proc = subprocess.Popen(_hook(tmp_path / "root"), stdin=subprocess.PIPE)
    # Until it has exited early or waits in a read of its stdin (syscall 0 on x86-64, 63 on arm64, fd 0).
    read = {"x86_64": "0", "aarch64": "63"}[os.uname().machine]
    wait_for(lambda: proc.poll() is not None or _syscall(proc.pid)[:2] == [read, "0x0"],
             "the hook exits or reads the state")
    proc.stdin.write(STATE.encode() * 1000)  # more than any pipe buffer: only a reader takes it
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_the_mask_script_mounts_the_masked_params_read_only(tmp_path):
    """The kernel's params: here this process's own /proc/driver, bound from the test's tree
    (as on a simulated node; any other file that is not on procfs is refused)."""
    params = tmp_path / "root/proc/driver/nvidia/params"
    params.parent.mkdir(parents=True)
    params.write_text("ModifyDeviceFiles: 1\n")

    def run():
        subprocess.run(["mount", "--bind", str(tmp_path / "root/proc/driver"), "/proc/driver"], check=True)
        result = _mask(tmp_path / "root")
        seen = params.read_text()
        try:
            params.write_text("x")
            writable = True
        except OSError:
            writable = False
        return result.returncode, result.stderr, seen, writable

    assert in_private_mount_namespace(run) == (0, "", "ModifyDeviceFiles: 0\n", False)
    assert params.read_text() == "ModifyDeviceFiles: 1\n"  # only in that namespace


def test_the_mask_script_leaves_a_container_without_driver_params(tmp_path):
    (tmp_path / "root/proc").mkdir(parents=True)
    assert _mask(tmp_path / "root").returncode == 0


def test_the_mask_script_refuses_an_image_proc_symlink(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root/proc").symlink_to("/proc")
    result = _mask(tmp_path / "root")
    assert result.returncode == 1 and "reached through a symlink; refusing to mask it" in result.stderr


def test_planning_writes_nothing(setup):
    _, _, rootfs, bundle = setup

    def listing():
        return subprocess.run(["find", rootfs, bundle, "-printf", "%p %y %s %T@\n"], capture_output=True,
                              text=True, check=True).stdout

    before = listing()
    assert _plan(setup) is not None
    assert _plan(setup, {"mounts": [{"destination": "/etc", "source": "/x"}]}) is None
    assert listing() == before


def _graphics(setup):
    config, _, rootfs, bundle = setup
    edits = injection.container_edits(
        request_mod.from_env({"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "graphics"}, config),
        Driver.from_config(config), config, hook_path="/usr/bin/nvct")
    return edits, prepare.plan({"mounts": []}, edits, rootfs, bundle, config.proc_root)


def test_a_gpus_dev_links_join_the_mask_and_the_rest_is_still_written_early(setup, sim_node):
    """/dev is the runtime's tmpfs: the DRM by-path links are the hook's, in the one hook that masks."""
    _, _, rootfs, _ = setup
    edits, plan = _graphics(setup)
    assert plan is not None
    plan.edit(edits)
    plan.write()
    [hook] = edits.hooks
    bus = sim_node["gpus"][1]["bus_id"]
    assert hook.args[5:] == ("disable-device-node-modification", "--", "create-symlinks",
                             "--link", f"../card1::/dev/dri/by-path/pci-{bus}-card",
                             "--link", f"../renderD129::/dev/dri/by-path/pci-{bus}-render")
    assert os.path.islink(os.path.join(rootfs, LIBDIR.lstrip("/"), "libEGL_nvidia.so.0"))
    assert not os.path.exists(os.path.join(rootfs, "dev/dri"))


def test_without_params_to_mask_the_dev_links_keep_their_own_hook(setup):
    edits, plan = _graphics(setup)
    assert plan is not None
    plan.mask = False
    plan.edit(edits)
    [hook] = edits.hooks
    assert [s.name for s in hook.steps] == ["create-symlinks"]
    assert all(link.startswith("/dev/dri/by-path/") for _, link in hook.steps[0].links)


# -- the hook left for after the runtime's create (Plan.after_create) ---------------------------------------

_PROC = {"destination": "/proc", "type": "proc", "source": "proc"}


def _spec(plan, edits, **extra) -> dict:
    """The spec as the shim saves it: the plan's edits applied."""
    from nvct.edits import apply

    spec = {"ociVersion": "1.0.2", "process": {"env": [], "args": ["true"]}, "mounts": [dict(_PROC)],
            "linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}]}, **extra}
    plan.edit(edits)
    apply.apply_edits(spec, edits)
    return spec


@pytest.mark.parametrize("graphics", [False, True])
def test_a_create_leaves_the_mask_and_dev_links_to_the_shim_after_the_runtimes_create(setup, graphics):
    from nvct.edits import steps as kinds

    _, edits, rootfs, _ = setup
    edits, plan = _graphics(setup) if graphics else (edits, _plan(setup))
    spec = _spec(plan, edits)
    [hook] = spec["hooks"]["createContainer"]
    assert plan.after_create(spec, "run") is None and spec["hooks"]["createContainer"] == [hook]
    after = plan.after_create(spec, "create")
    assert "createContainer" not in spec["hooks"]
    st = os.stat(rootfs)
    assert (after.rootfs, after.identity) == (rootfs, (st.st_dev, st.st_ino))
    names = [type(s) for s in after.steps]
    assert names == [kinds.MaskParams] + ([kinds.CreateSymlinks] if graphics else [])
    plan.root.close()


@pytest.mark.parametrize("case", ["user-namespace", "host-mount-namespace", "joined-mount-namespace", "no-proc",
                                  "another-step", "another-root"])
def test_the_hook_stays_where_only_it_can(setup, case):
    """A user namespace (its mounts and files are the hook's), no mount namespace of the container's own
    (the host's, or one joined by path), no /proc of the runtime's, a chain step other than the mask and
    /dev links, a chain for another root: the hooks stay, all of nvct's."""
    _, edits, rootfs, _ = setup
    plan = _plan(setup)
    spec = _spec(plan, edits)
    hooks = spec["hooks"]["createContainer"]
    if case == "user-namespace":
        spec["linux"]["namespaces"].append({"type": "user"})
    elif case == "host-mount-namespace":
        spec["linux"]["namespaces"] = [{"type": "pid"}]
    elif case == "joined-mount-namespace":
        spec["linux"]["namespaces"][0]["path"] = "/proc/1/ns/mnt"
    elif case == "no-proc":
        spec["mounts"] = []
    elif case == "another-step":
        hooks[0]["args"] += ["--", "chmod", "--mode", "755", "--path", "/dev/dri"]
    else:
        hooks.append(dict(hooks[0], args=[a if a != rootfs else rootfs + "2" for a in hooks[0]["args"]]))
    before = [dict(h) for h in hooks]
    assert plan.after_create(spec, "create") is None
    assert spec["hooks"]["createContainer"] == before
    plan.root.close()
