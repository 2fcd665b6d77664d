"""Images whose environment tries to take over nvct's hooks, through the real runtimes.

CVE-2025-23266 class: a hook without ``env`` runs with its runtime's environment,
and runc gives a createContainer hook the *container's*, cwd its rootfs. The image
sets the loader's and Python's variables (``LD_PRELOAD`` relative, through
``/proc/self/cwd`` and absolute, ``LD_AUDIT``, ``LD_LIBRARY_PATH``, ``GCONV_PATH``,
``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONHOME``, ``PYTHONINSPECT``) and ships a
library (constructor, audit and gconv entry points) and Python modules that write
a marker, naming their process, into a host directory that does not exist in the
container. The container's own processes load them too and find no such directory;
any marker there was written by a process with the host in view: a hook.

The earlier classes (image directories nvct writes into, symlinked to a host
directory) run the same way. Every case runs through nvct's shim under runc and crun
in legacy, jit-cdi and cdi mode (a spec from ``nvct cdi generate``), in legacy mode with the hook
appended by the shim's sh front, and under podman with the hooks.d hook.
Each must start with its GPU, leave no marker and nothing mounted. A stale spec
whose nvct hook lacks env is sealed by the shim; an environment the seal let through
is set aside by the hook's sh front before its interpreter starts (nvct.oci.environ).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.support.bundle import make_bundle
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries, need_root, need_rootfs_tools
from tests.support.gpu_runs import (
    MODES,
    NVCT,
    PATH_ENV,
    SHIM,
    mounts_under,
    need_runtime,
    node_config,
    run_gpu,
    spec_dir,
)
from tests.support.image import ImageSpec, build_image_tar
from tests.support.legacy_front import gpu_front, run
from tests.support.podman import Podman, packaged_hooks_dir
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import CRUN, RUNC, RUNTIMES, run_container

pytestmark = pytest.mark.containers

HOOK = os.path.join(os.path.dirname(SHIM), "nvidia-container-runtime-hook")
PY = "python3.11"

EVIL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

static void mark(const char *how) {
    char exe[512] = "?", ns[64] = "?", path[800], line[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n > 0) ns[n] = 0;
    snprintf(path, sizeof path, "%s/%s.%d", MARK, how, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    int len = snprintf(line, sizeof line, "%s: pid %d exe %s pidns %s\n", how, (int)getpid(), exe, ns);
    if (write(fd, line, len) < 0) {}
    close(fd);
}

__attribute__((constructor)) static void loaded(void) { mark("constructor"); }
unsigned int la_version(unsigned int version) { mark("audit"); return version; }
int gconv_init(void *step) { mark("gconv"); return 0; }
int gconv(void *a, void *b, void *c, void *d, int e, int f) { return 0; }
"""

EVIL_PY = """
import os
try:
    with open("%(mark)s/python-%(how)s.%%d" %% os.getpid(), "w") as f:
        f.write("python-%(how)s: pid %%d exe %%s pidns %%s\\n" %% (
            os.getpid(), os.readlink("/proc/self/exe"), os.readlink("/proc/self/ns/pid")))
except OSError:
    pass
"""

#: case id -> the image's environment. Relative and /proc/self/cwd paths reach the image
#: from a hook whose cwd is the rootfs (runc's createContainer); absolute ones the host's.
CASES = {
    "ld-preload-relative": ["LD_PRELOAD=./evil.so"],
    "ld-preload-cwd": ["LD_PRELOAD=/proc/self/cwd/evil.so"],
    "ld-preload-absolute": ["LD_PRELOAD=/usr/lib/evil.so"],
    "ld-audit": ["LD_AUDIT=/proc/self/cwd/evil.so"],
    "ld-library-path": ["LD_LIBRARY_PATH=/proc/self/cwd/evil-libs:evil-libs"],
    "gconv-path": ["GCONV_PATH=/proc/self/cwd/gconv", "LANG=EVIL"],
    "pythonpath": ["PYTHONPATH=/proc/self/cwd/pymods:pymods"],
    "pythonstartup": ["PYTHONSTARTUP=/proc/self/cwd/startup.py", "PYTHONINSPECT=1"],
    "pythonhome": ["PYTHONHOME=/proc/self/cwd/pyhome"],
    "pythoninspect": ["PYTHONINSPECT=1"],
}
GPU_CHECK = "test -c /dev/nvidia0 && dlopen-probe libcuda.so.1 >/dev/null && echo gpu-ok"


@pytest.fixture(scope="session")
def kit(tmp_path_factory):
    """(marker dir on the host, a tree of the hostile files to copy into an image's root)."""
    need_root()
    need_rootfs_tools()
    need_binaries("/usr/bin/gcc")
    base = tmp_path_factory.mktemp("hostile")
    mark = base / "host-markers"
    mark.mkdir()
    tree = base / "tree"
    src = base / "evil.c"
    src.write_text(EVIL_C)
    lib = tree / "usr/lib/evil.so"
    lib.parent.mkdir(parents=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O", f'-DMARK="{mark}"', "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    for copy in ("evil.so", "evil-libs/libz.so.1", "evil-libs/libexpat.so.1", "gconv/EVIL.so"):
        (tree / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, tree / copy)
    (tree / "gconv/gconv-modules").write_text("module EVIL// INTERNAL EVIL 1\nmodule INTERNAL EVIL// EVIL 1\n")
    for path, how in (("pymods/sitecustomize.py", "path"), ("pymods/nvct/__init__.py", "path"),
                      ("startup.py", "startup"), (f"pyhome/lib/{PY}/encodings/__init__.py", "home"),
                      (f"pyhome/lib/{PY}/site.py", "home")):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(EVIL_PY % {"mark": mark, "how": how})
    return mark, tree


def _plant(tree, rootfs) -> None:
    shutil.copytree(tree, rootfs, symlinks=True, dirs_exist_ok=True)


def _assert_sealed(result, kit, under) -> None:
    """Ran with its GPU, no marker on the host, nothing left mounted under ``under``."""
    mark, _ = kit
    markers = {p.name: p.read_text() for p in mark.iterdir()}
    for p in mark.iterdir():
        p.unlink()
    assert not markers, f"written outside the container: {markers}"
    assert result.rc == 0 and "gpu-ok" in result.stdout, result.describe()
    assert not mounts_under(str(under))


def _hostile_rootfs(tmp_path, kit) -> str:
    rootfs = make_rootfs(tmp_path)
    _plant(kit[1], rootfs)
    return rootfs


def _request(mode: str) -> str:
    return "NVIDIA_VISIBLE_DEVICES=" + ("nvidia.com/gpu=0" if mode == "cdi" else "0")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_the_image_env_never_reaches_a_hook(tmp_path, sim_node, kit, runtime, mode, case):
    need_runtime(runtime)
    rootfs = _hostile_rootfs(tmp_path, kit)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                     env=[_request(mode), *CASES[case]], command=GPU_CHECK)
    _assert_sealed(result, kit, tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_the_image_env_never_reaches_the_hook_the_shims_sh_front_appends(tmp_path, sim_node, kit, runtime, case):
    """Legacy mode under a recorded config: the hook comes from the sh front, not from Python."""
    need_runtime(runtime)
    front, config = gpu_front(tmp_path, sim_node["config"], RUNTIMES[runtime][0])
    bundle = make_bundle(tmp_path / "bundle", _hostile_rootfs(tmp_path, kit), ["sh", "-c", GPU_CHECK],
                         env=[PATH_ENV, _request("legacy"), *CASES[case]])
    result = run(front, config, bundle, log_file=str(tmp_path / "runc.log"))
    assert front.starts() == {"shim": 1, "hook": 1}  # the shim's Python only recorded the config
    _assert_sealed(result, kit, tmp_path)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_a_stale_spec_without_hook_env_is_sealed_by_the_shim(tmp_path, sim_node, kit, runtime):
    """The generated spec as older versions wrote it (hooks without env): the shim seals nvct's hook."""
    import yaml

    need_runtime(runtime)
    config = node_config(tmp_path, sim_node, mode="cdi", runtime=runtime)
    spec = os.path.join(spec_dir(tmp_path), "nvidia.yaml")
    with open(spec) as f:
        raw = yaml.safe_load(f)
    for hook in raw["containerEdits"]["hooks"]:
        del hook["env"]
    with open(spec, "w") as f:
        yaml.safe_dump(raw, f)
    rootfs = _hostile_rootfs(tmp_path, kit)
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", GPU_CHECK],
                         [PATH_ENV, _request("cdi"), *CASES["ld-preload-cwd"], *CASES["pythonpath"]])
    result = run_container([SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                                "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, timeout=60)
    _assert_sealed(result, kit, tmp_path)
    assert "has no env (an nvct bug, or a spec from an older version)" in (tmp_path / "nvct.log").read_text()


def test_an_env_the_seal_let_through_is_set_aside(tmp_path, kit):
    """A hand-made createContainer hook without env under runc: the container's PYTHONPATH,
    GCONV_PATH and LD_LIBRARY_PATH reach ``nvct hook``, whose sh front sets them aside before
    Python starts; nothing of theirs runs, and the hook does its step."""
    need_runtime("runc")
    rootfs = _hostile_rootfs(tmp_path, kit)
    hook = {"path": NVCT, "args": ["nvct", "hook", "chain", "disable-device-node-modification"]}
    env = [PATH_ENV, *CASES["pythonpath"], *CASES["gconv-path"], *CASES["ld-library-path"]]
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env, hooks={"createContainer": [hook]})
    result = run_container([RUNC], bundle, timeout=60)
    assert result.rc == 0, result.describe()
    assert not list(kit[0].iterdir())


@pytest.fixture(scope="module", params=["runc", "crun"])
def hostile_podman(request, tmp_path_factory, sim_node, kit):
    """Podman with the packaged hooks.d hook (pointed at our hook and the node's config) and
    an image carrying the hostile files."""
    need_runtime(request.param)
    need_binaries("/usr/bin/podman")
    hooks = packaged_hooks_dir(tmp_path_factory.mktemp("hooks.d"), HOOK, sim_node["config"])
    image_dir = tmp_path_factory.mktemp("hostile-image")
    rootfs = _hostile_rootfs(image_dir, kit)
    image = ImageSpec()
    build_image_tar(rootfs, image_dir / "image.tar", image.name, image.tag)
    with Podman(runtime={"runc": RUNC, "crun": CRUN}[request.param], hooks_dirs=[hooks]) as podman:
        podman.load(image_dir / "image.tar")
        yield podman


def test_podman_hooks_d_hook_never_sees_the_image_env(hostile_podman, kit):
    env = [e for case in sorted(CASES) if case != "pythonhome" for e in CASES[case]
           if not e.startswith(("LD_PRELOAD=", "LANG="))]
    for extra in (["LD_PRELOAD=./evil.so:/proc/self/cwd/evil.so:/usr/lib/evil.so"],
                  ["PYTHONHOME=/proc/self/cwd/pyhome"]):
        args = ["--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0"]
        for e in env + extra:
            args += ["-e", e]
        result = hostile_podman.run(args + [BUSYBOX_IMAGE_QUALIFIED, "sh", "-c", GPU_CHECK])
        _assert_sealed(result, kit, hostile_podman.data_root)


#: Earlier classes (CVE-2024-0132 family), now through both runtimes and every mode: an image
#: directory nvct writes into is a symlink to a host directory (absolute or relative).
LAYOUT_CASES = {
    "libdir-absolute": ("/usr/lib/x86_64-linux-gnu", False),
    "libdir-relative": ("/usr/lib/x86_64-linux-gnu", True),
    "firmware": ("/lib/firmware/nvidia", False),
    "ld-so-conf-d": ("/etc/ld.so.conf.d", True),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_symlinked_image_dirs_never_reach_the_host(tmp_path, sim_node, runtime, mode, case):
    from tests.security.conftest import snapshot
    from tests.support.gpu_runs import refusal

    need_runtime(runtime)
    host = tmp_path / "host"
    (host / "keep").mkdir(parents=True)
    (host / "keep" / "file").write_text("host\n")
    (host / "libhost.so.1").write_text("host\n")
    before = snapshot(host)
    rootfs = make_rootfs(tmp_path)
    inner, relative = LAYOUT_CASES[case]
    planted = os.path.join(rootfs, inner.lstrip("/"))
    if os.path.islink(planted) or os.path.isfile(planted):
        os.unlink(planted)
    elif os.path.isdir(planted):
        shutil.rmtree(planted)
    os.makedirs(os.path.dirname(planted), exist_ok=True)
    os.symlink(os.path.relpath(host, os.path.dirname(planted)) if relative else str(host), planted)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime,
                     env=[_request(mode)], command="true")
    if not result.ok:
        refusal(result, tmp_path)  # one clear error, no traceback
    assert snapshot(host) == before
    assert not mounts_under(str(tmp_path))
