"""A node without Python: ``nvct toolkit install`` from the image, then GPU containers on the node.

The node (tests/toolkit/pythonless.py) has busybox, runc and the simulated
driver, and no python3, no Python library, no libc or loader where programs
look for them. The installer runs in this machine's environment (the image's)
with the node's toolkit directory mounted at the node's own path, as the
DaemonSet does. Containers then run *inside* the node (its ``/`` pivoted to),
through the installed ``nvidia-container-runtime`` with runc, traced by strace:
every file a process of the installed programs opened must be in the toolkit
directory, the driver root, the bundle, runc's state or ``/proc``/``/sys``/``/dev``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from nvct.toolkit.layout import TOOLS, Layout
from tests.e2e.conftest import PATH_ENV, expected_nodes
from tests.support import cgroupfix
from tests.support.bundle import make_bundle
from tests.support.fixtures import need_binaries, need_root, rootfs  # noqa: F401 - fixtures
from tests.support.runtimes import run_container
from tests.toolkit import pythonless
from tests.toolkit.installer import NVCT, node_flags

pytestmark = pytest.mark.containers

TOOLKIT = os.path.join(pythonless.TOOLKIT_INSTALL_DIR, "toolkit")
LIST_NODES = "find /dev -type c -name 'nvidia*' | sort"
#: What the image's environment must not lend the node's programs.
HOSTILE_ENV = {"PYTHONHOME": "/usr", "PYTHONPATH": "/usr/lib/python3/dist-packages",
               "LD_LIBRARY_PATH": "/lib/x86_64-linux-gnu"}


@pytest.fixture(scope="session")
def pythonless_node(tmp_path_factory, sim_node):
    """(tree, install log): the node built and the toolkit installed into it, once per session."""
    need_root("mounts, pivot_root, runs containers")
    need_binaries("/usr/bin/strace", "/usr/bin/patchelf", "/usr/bin/unshare", pythonless.RUNC,
                  pythonless.BUSYBOX)
    cgroupfix.ensure_crun_works()
    tree = pythonless.build_host(str(tmp_path_factory.mktemp("pythonless-node")))
    mountpoint = pythonless.TOOLKIT_INSTALL_DIR
    made = not os.path.exists(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    pid_file = os.path.join(str(tmp_path_factory.mktemp("installer")), "toolkit.pid")
    install = [NVCT, "toolkit", "install", "--toolkit-install-dir", mountpoint, "--no-daemon",
               "--no-runtime-config", "--host-root", tree, "--pid-file", pid_file, *node_flags(sim_node),
               "--nvidia-container-runtime.mode", "jit-cdi"]
    try:
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               'mount --bind "$0/$1" "$1" && shift && exec "$@"', tree, mountpoint, *install],
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        if made:
            os.rmdir(mountpoint)
    assert proc.returncode == 0, proc.stderr
    yield tree, proc.stderr
    shutil.rmtree(tree, ignore_errors=True)


def test_the_node_has_no_python_and_no_libc_where_programs_look(pythonless_node):
    tree, log = pythonless_node
    for d in ("usr/lib", "lib", "lib64", "usr/lib64", "usr/local/lib"):
        assert not os.path.exists(os.path.join(tree, d)), d
    assert not [p for p in ("usr/bin/python3", "bin/python3") if os.path.exists(os.path.join(tree, p))]
    assert "host check: ok: Python 3" in log  # the installed nvct ran chrooted into the node


def test_every_installed_program_starts_on_the_node(pythonless_node, tmp_path):
    tree, _ = pythonless_node
    programs = [os.path.basename(p) for p in Layout(TOOLKIT).runtimes().values()] + list(TOOLS)
    script = "; ".join(f'{os.path.join(TOOLKIT, p)} --version >/dev/null || echo "{p} failed: $?"'
                       for p in programs)
    proc = subprocess.run([*pythonless.launcher(tree, str(tmp_path)), "/bin/sh", "-c", script + "; echo done"],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                          cwd=str(tmp_path),
                          check=False)
    assert proc.stdout == "done\n", proc.stdout + proc.stderr


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_gpu_containers_run_on_the_node_and_its_programs_read_only_their_own_files(
        pythonless_node, sim_node, rootfs, tmp_path, mode):
    tree, _ = pythonless_node
    runtime = os.path.join(TOOLKIT, "nvidia-container-runtime" + (".legacy" if mode == "legacy" else ""))
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh", "-c", f"{LIST_NODES} && "
                         "dlopen-probe libcuda.so.1 libnvidia-ml.so.1 && nvidia-smi -L"],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=1,3"])
    state = str(tmp_path / "state")
    trace = str(tmp_path / "trace")
    argv = [*pythonless.STRACE, "-o", trace, *pythonless.launcher(tree, str(tmp_path)), runtime]
    result = run_container(argv, bundle, root=state, timeout=60,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **HOSTILE_ENV})
    assert result.rc == 0, result.describe()

    lines = result.stdout.splitlines()
    assert {line for line in lines if line.startswith("/dev/")} == expected_nodes(sim_node, [1, 3])
    probes = [line for line in lines if line.startswith("ok ")]
    assert probes[0].startswith("ok libcuda.so.1 /usr/lib/x86_64-linux-gnu/")
    assert probes[1].startswith("ok libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/")
    uuids = [sim_node["gpus"][i]["uuid"] for i in (1, 3)]
    assert [line for line in lines if line.startswith("GPU ")] == [
        f"GPU {n}: NVIDIA H100 80GB HBM3 (UUID: {u})" for n, u in enumerate(uuids)]

    opened = pythonless.opened_by(trace, TOOLKIT + "/")
    interpreters = [p for p in opened if p.startswith(f"{TOOLKIT}/.runtime/") and "/lib/ld-linux" in p]
    assert interpreters, f"no process ran the toolkit's own Python: {sorted(opened)}"
    own = {p for paths in opened.values() for p in paths if p.startswith(f"{TOOLKIT}/.runtime/")}
    assert {"libc.so.6", "python3.11"} <= {os.path.basename(p) for p in own}  # its own libc, its own Python
    assert any("/lib/python/nvct/" in p for p in own)
    if mode == "legacy":
        assert os.path.join(TOOLKIT, "nvidia-container-runtime-hook") in opened
    # The toolkit, the driver (dev and proc roots are in it), the container, runc's state, the kernel's
    # file systems and nvct's own caches in /run.
    allowed = (TOOLKIT + "/", sim_node["roots"]["driver_root"] + "/", bundle + "/", rootfs + "/", state + "/",
               "/proc/", "/sys/", "/dev/", "/run/nvct/")
    # "/" and "/run": the directories nvct walks, following no symlink, on its way to /run/nvct.
    programs = {pythonless.RUNC, "/sbin/ldconfig", "/bin/sh", "/", "/run"}
    outside = {f"{program}: {path}" for program, paths in opened.items() for path in paths
               if not (path + "/").startswith(allowed) and path not in programs}
    assert outside == set()
