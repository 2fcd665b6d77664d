"""User-namespaced GPU containers in sandbox mode: runc and crun with ``uidMappings``, podman ``--userns=auto``.

The container's root is host uid :data:`HOST_ID` (the rootfs is shifted to it,
as engines that remap users own it). On a GPU host /proc/driver/nvidia
exists and the device nodes are in the host's /dev: the runtimes run in a
private mount namespace whose /dev is overlaid with the simulated node's
(a user-namespaced container gets its device nodes bind-mounted from /dev,
as mknod is refused there) and whose /proc/driver is the node's, and the
container's /proc is that /proc (as in test_procfs_masking).

In sandbox mode (jit-cdi with the ``nvct/sandbox`` annotation or
``nvct.sandbox = "always"``, or a spec from ``cdi generate --mode sandbox``)
the GPU works and libcuda and NVML load by SONAME from an image whose ld
cache has no entry for them. The hooked modes fail in the same container:
the params overmount cannot be made in a mount namespace a user namespace
owns, and legacy mode cannot make device nodes in a root it does not own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile

import pytest

from tests.support.bundle import make_bundle, read_config
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, busybox_image_tar, private_podman  # noqa: F401 - fixtures
from tests.support.gpu_runs import NVCT, PATH_ENV, SHIM, need_runtime, node_config
from tests.support.proc import run
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import RUNTIMES, run_container

pytestmark = pytest.mark.containers

#: The host uid and gid of the container's root.
HOST_ID = 300000
ID_RANGE = 65536
CHECK = ("cat /proc/self/uid_map && dlopen-probe libcuda.so.1 libnvidia-ml.so.1 libcuda.so libnvidia-ml.so && "
         "nvidia-smi -L && "
         "{ grep ModifyDeviceFiles /proc/driver/nvidia/params 2>/dev/null || true; }")


@pytest.fixture(scope="module")
def open_tmp():
    """A temp dir others may traverse: the container's root (a mapped uid) opens the node's files and its rootfs."""
    path = tempfile.mkdtemp(prefix="nvct-userns-")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def node(open_tmp):
    need_runtime("runc")
    from nvct.simulate import cached_node

    return cached_node(os.path.join(open_tmp, "sim"))


@pytest.fixture
def work(open_tmp):
    path = tempfile.mkdtemp(dir=open_tmp)
    os.chmod(path, 0o755)
    return path


def _shift(root: str, offset: int) -> None:
    """Every file's owner moved up by ``offset``, as a user-remapping engine owns an image."""
    st = os.lstat(root)
    os.lchown(root, st.st_uid + offset, st.st_gid + offset)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            os.lchown(path, st.st_uid + offset, st.st_gid + offset)


@pytest.fixture
def mapped_rootfs(work):
    root = make_rootfs(work)
    assert not os.path.exists(os.path.join(root, "usr/lib/x86_64-linux-gnu/libcuda.so.1"))
    _shift(root, HOST_ID)
    return root


_NODE_VIEW = """
mount --rbind /dev "$1" && mount -t overlay overlay -o "lowerdir=$0/dev:$1" /dev || exit 1
for d in pts shm mqueue; do [ ! -d "$1/$d" ] || mount --rbind "$1/$d" "/dev/$d" || exit 1; done
[ -z "$2" ] || mount --bind "$0/proc/driver" /proc/driver || exit 1
shift 2 && exec "$@"
"""


def _node_view(node, proc: bool = True) -> list[str]:
    """argv prefix: a private mount namespace with the node's device nodes in /dev and its /proc/driver.

    /dev is an overlay of the node's /dev on the host's (its pts, shm and mqueue mounted back).
    ``proc=False``: the host's /proc/driver (a new procfs is refused in a user namespace where
    /proc has a mount over part of it, and podman's runtime mounts one).
    """
    scratch = tempfile.mkdtemp(dir=os.path.dirname(node["roots"]["dev_root"]))
    return ["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c", _NODE_VIEW,
            node["roots"]["dev_root"], scratch, "proc" if proc else ""]


def _userns(spec: dict) -> None:
    spec["linux"]["namespaces"].append({"type": "user"})
    for key in ("uidMappings", "gidMappings"):
        spec["linux"][key] = [{"containerID": 0, "hostID": HOST_ID, "size": ID_RANGE}]
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/proc"]
    spec["mounts"].insert(0, {"destination": "/proc", "type": "bind", "source": "/proc",
                              "options": ["rbind", "nosuid", "nodev", "noexec"]})


def _run(work, node, rootfs, *, mode, runtime="runc", env=(), annotations=None, config_edit=None, extra="",
         bundle_mode=0o755):
    """The check in a user-namespaced container through the shim; (result, the config.json it ran)."""
    need_runtime(runtime)
    config = node_config(work, node, mode=mode, runtime=RUNTIMES[runtime][0], extra=extra)
    if config_edit is not None:
        with open(config) as f:
            text = f.read()
        with open(config, "w") as f:
            f.write(config_edit(text))
    bundle = make_bundle(os.path.join(work, "bundle"), rootfs, ["sh", "-c", CHECK], env=[PATH_ENV, *env],
                         annotations=annotations)
    from tests.support.bundle import edit_config

    with edit_config(bundle) as spec:
        _userns(spec)
    os.chmod(bundle, bundle_mode)
    result = run_container([*_node_view(node), SHIM], bundle, timeout=60,
                           env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    return result, read_config(bundle)


def _assert_gpu_works(result, node, index: int, runtime: str) -> None:
    assert result.ok, result.describe()
    lines = result.stdout.splitlines()
    assert lines and lines[0].split()[:2] != ["0", "0"], f"not in a user namespace: {result.describe()}"
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so", "libnvidia-ml.so"):
        assert any(line.startswith(f"ok {name} ") for line in lines), result.describe()
    gpus = [line for line in lines if line.startswith("GPU ")]
    assert len(gpus) == 1 and f"(UUID: {node['gpus'][index]['uuid']})" in gpus[0], result.describe()
    if runtime == "runc":  # the node's params, unmasked: no overmount (crun gives the container its own /proc)
        assert "ModifyDeviceFiles: 1" in lines, result.describe()


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_jit_cdi_sandbox_by_annotation(work, node, mapped_rootfs, runtime):
    result, spec = _run(work, node, mapped_rootfs, mode="jit-cdi", runtime=runtime,
                        env=["NVIDIA_VISIBLE_DEVICES=1"], annotations={"nvct/sandbox": "true"})
    _assert_gpu_works(result, node, 1, runtime)
    assert not spec.get("hooks"), spec.get("hooks")


@pytest.mark.parametrize("layout", ["no-ld-cache", "merged-usr"])
def test_sandbox_without_an_ld_cache_and_in_a_merged_usr_image(work, node, layout):
    """No /etc/ld.so.cache at all: the loader's own folders; merged /usr: /lib64 and /lib are links."""
    root = make_rootfs(work, merged_usr=layout == "merged-usr")
    if layout == "no-ld-cache":
        os.unlink(os.path.join(root, "etc/ld.so.cache"))
    else:
        assert os.path.islink(os.path.join(root, "lib64"))
    _shift(root, HOST_ID)
    result, _ = _run(work, node, root, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=0"],
                     annotations={"nvct/sandbox": "true"})
    _assert_gpu_works(result, node, 0, "runc")


def test_jit_cdi_sandbox_by_config(work, node, mapped_rootfs):
    result, spec = _run(work, node, mapped_rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=2"],
                        config_edit=lambda t: t.replace("[nvct]\n", '[nvct]\nsandbox = "always"\n', 1))
    _assert_gpu_works(result, node, 2, "runc")
    assert not spec.get("hooks"), spec.get("hooks")


def test_jit_cdi_with_hooks_runs_under_a_bundle_only_host_root_may_enter(work, node, mapped_rootfs):
    """The params mask is made by the hook from the container's own params (a detached tmpfs file),
    nothing in the bundle: a bundle only host root may enter is no obstacle in the user namespace
    (the sh hook's mask came from the bundle and was refused there); the sandbox edits run too."""
    result, _ = _run(work, node, mapped_rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=1"],
                     bundle_mode=0o700)
    assert result.ok, result.describe()
    assert "ModifyDeviceFiles: 0" in result.stdout.splitlines(), result.describe()
    result, _ = _run(work, node, mapped_rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=1"],
                     bundle_mode=0o700, annotations={"nvct/sandbox": "true"})
    _assert_gpu_works(result, node, 1, "runc")


def test_legacy_fails_in_a_user_namespace(work, node, mapped_rootfs):
    result, _ = _run(work, node, mapped_rootfs, mode="legacy", env=["NVIDIA_VISIBLE_DEVICES=1"])
    assert not result.ok, result.describe()
    assert "nvidia-container-runtime-hook" in result.stderr, result.describe()


def _generate(config: str, output: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = config
    proc = subprocess.run([NVCT, "cdi", "generate", "--hook-path", NVCT, "--output", output, *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_cdi_mode_with_the_generated_sandbox_spec(work, node, mapped_rootfs, runtime):
    specs = os.path.join(work, "specs")
    _generate(node["config"], os.path.join(specs, "nvidia.yaml"), "--mode", "sandbox")
    result, spec = _run(work, node, mapped_rootfs, mode="cdi", runtime=runtime,
                        env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=3"],
                        extra=f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{specs}"]\n')
    _assert_gpu_works(result, node, 3, runtime)
    assert not spec.get("hooks"), spec.get("hooks")


def test_a_spec_with_every_hook_disabled_has_no_soname(work, node, mapped_rootfs):
    """What upstream's draft sandbox mode gives (#1720: the hooks dropped only): no libcuda.so.1."""
    specs = os.path.join(work, "specs")
    _generate(node["config"], os.path.join(specs, "nvidia.yaml"), "--disable-hooks", "all")
    result, _ = _run(work, node, mapped_rootfs, mode="cdi", env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=3"],
                     extra=f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{specs}"]\n')
    assert not result.ok and "libcuda.so.1" in result.stdout + result.stderr, result.describe()
    assert "ok libcuda.so.1" not in result.stdout, result.describe()


@contextlib.contextmanager
def _subids():
    """/etc/subuid and /etc/subgid give podman's ``containers`` user a range (``--userns=auto``); restored after."""
    saved = {}
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            with open(path) as f:
                saved[path] = f.read()
        except FileNotFoundError:
            saved[path] = None
    try:
        for path, text in saved.items():
            with open(path, "a") as f:
                if text and not text.endswith("\n"):
                    f.write("\n")
                f.write(f"containers:{HOST_ID}:{ID_RANGE}\n")
        yield
    finally:
        for path, text in saved.items():
            if text is None:
                os.unlink(path)
            else:
                with open(path, "w") as f:
                    f.write(text)


@pytest.fixture(scope="module")
def userns_podman(private_podman, node):
    with _subids():
        yield private_podman


def _podman(podman, node, *args: str):
    return run([*_node_view(node, proc=False), "/usr/bin/podman", "run", "--rm", "--userns=auto", *args,
                BUSYBOX_IMAGE_QUALIFIED, "sh", "-c", CHECK], env=podman.env, timeout=120)


def test_podman_userns_auto_with_the_generated_sandbox_spec(userns_podman, node, open_tmp):
    from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor

    vendor = unique_cdi_vendor()
    out = os.path.join(tempfile.mkdtemp(dir=open_tmp), "spec.yaml")
    _generate(node["config"], out, "--mode", "sandbox", "--vendor", vendor)
    with open(out) as f:
        text = f.read()
    with cdi_spec(text, directory=CDI_DIRS[1], suffix=".yaml"):
        result = _podman(userns_podman, node, "--device", f"{vendor}/gpu=1")
    _assert_gpu_works(result, node, 1, "crun")


def test_podman_userns_auto_jit_cdi_by_annotation(busybox_image_tar, node, work):
    """podman --runtime nvct's shim, jit-cdi: the annotation gives sandbox edits in podman's user namespace."""
    from tests.support.podman import Podman

    config = node_config(work, node, mode="jit-cdi", runtime=RUNTIMES["crun"][0])
    runtime = os.path.join(work, "nvct-runtime")  # conmon passes the runtime no env of podman's
    with open(runtime, "w") as f:
        f.write(f'#!/bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH="{config}" exec "{SHIM}" "$@"\n')
    os.chmod(runtime, 0o755)
    with _subids(), Podman(runtimes={"nvct": runtime}) as podman:
        podman.load(busybox_image_tar)
        result = _podman(podman, node, "--runtime", "nvct", "--annotation", "nvct/sandbox=true",
                         "-e", "NVIDIA_VISIBLE_DEVICES=2")
        _assert_gpu_works(result, node, 2, "crun")


@pytest.mark.parametrize("link", ["absolute", "relative"])
def test_hostile_loader_dir_link_stays_in_the_root(work, node, mapped_rootfs, link):
    """An image whose /usr/lib64 leads to a host directory: the sandbox mounts land in the root, or the
    start is refused; the host directory never gets a file."""
    canary = os.path.join(work, "host-dir")
    os.makedirs(canary)
    target = canary if link == "absolute" else "../.." + canary
    lib64 = os.path.join(mapped_rootfs, "usr/lib64")
    shutil.rmtree(lib64, ignore_errors=True)
    os.symlink(target, lib64)
    os.lchown(lib64, HOST_ID, HOST_ID)
    result, _ = _run(work, node, mapped_rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=1"],
                     annotations={"nvct/sandbox": "true"})
    assert os.listdir(canary) == [], result.describe()
    if result.ok:
        _assert_gpu_works(result, node, 1, "runc")
