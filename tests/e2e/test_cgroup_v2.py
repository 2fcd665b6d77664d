"""The hook as ``docker run --gpus`` runs it (a prestart hook in a plain spec) on cgroup v2 and v1.

cgroup v2 is reproduced faithfully: each runc call runs in a private mount
namespace with cgroup2 mounted on /sys/fs/cgroup, so runc works in unified
mode and enforces its own eBPF device filter. Inside the container every
injected node opens, a GPU node that was not requested and a device the
runtime denies stay denied, and /dev/null still works. After delete no
cgroup directory and no nvct program is left.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.e2e.conftest import HOOK, PATH_ENV, VENV_BIN, expected_nodes, node_config
from tests.support.bundle import edit_config, make_bundle
from tests.support.fixtures import BUSYBOX_IMAGE, need_binaries, need_root, need_rootfs_tools, skip
from tests.support.proc import wait_until
from tests.support.runtimes import RUNTIMES, run_container

pytestmark = pytest.mark.containers

#: runc in cgroup v2 mode: cgroup2 on /sys/fs/cgroup in a private mount namespace per call.
V2_RUNC = ["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
           'mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"', "sh", RUNTIMES["runc"][0]]
#: A node the test creates in the rootfs (outside the runtime's /dev): never granted.
RUNTIME_DENIED = ("c", 1, 1)  # /dev/mem: not in runc's default allow list
OPEN = ('for n in "$@"; do if err=$( (: <"$n") 2>&1); then echo "open $n"; '
        'else case $err in *"not permitted"*) echo "denied $n";; *) echo "open $n ($err)";; esac; fi; done')


def _v2_ok() -> str | None:
    proc = subprocess.run([*V2_RUNC[:-1], "/bin/true"], capture_output=True, text=True)
    return None if proc.returncode == 0 else f"cannot mount cgroup2 in a private mount namespace: {proc.stderr.strip()}"


@pytest.fixture
def v2_runc():
    need_root()
    need_rootfs_tools()
    need_binaries(RUNTIMES["runc"][0], "/usr/bin/unshare")
    reason = _v2_ok()
    if reason:
        skip(reason)
    return V2_RUNC


def _cases(manifest):
    return {
        "all": ("all", expected_nodes(manifest, range(len(manifest["gpus"])), [(0, 0), (0, 1)])),
        "1,3": ("1,3", expected_nodes(manifest, [1, 3])),
        "mig": ("0:1", expected_nodes(manifest, migs=[(0, 1)])),
        "none": ("none", expected_nodes(manifest)),
    }


def _unrequested_gpu(node, injected: set[str]) -> tuple[str, int, int]:
    """A GPU's char device the request did not name (a minor past the last GPU for "all")."""
    minors = [g["minor"] for g in node["gpus"]]
    free = [m for m in minors if f"/dev/nvidia{m}" not in injected]
    return ("c", 195, free[0] if free else max(minors) + 1)


def _hook_bundle(tmp_path, node, rootfs, visible: str, command: str, args=(),
                 injected: set[str] = frozenset()) -> tuple[str, str]:
    config = node_config(tmp_path, node, mode="legacy")
    probes = {"gpu": _unrequested_gpu(node, injected), "mem": RUNTIME_DENIED}
    for name, (_kind, major, minor) in probes.items():
        path = os.path.join(rootfs, "probe", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
    hook = {"path": HOOK, "args": ["nvidia-container-runtime-hook", "prestart"],
            "env": [f"NVIDIA_CTK_CONFIG_FILE_PATH={config}", PATH_ENV]}
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", command, "sh", *args],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={visible}"], hooks={"prestart": [hook]})
    return bundle, config


def _run(runtime_argv, tmp_path, bundle):
    cid = f"nvct-v2-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    result = run_container(runtime_argv, bundle, cid, log_file=os.path.join(str(tmp_path), "runc.log"))
    return cid, result


def _lines(result) -> dict[str, str]:
    assert result.rc == 0, result.describe()
    out = {}
    for line in result.stdout.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("open", "denied"):
            out[rest.split(" ")[0]] = verdict
    return out


def _assert_access(result, injected: set[str]) -> None:
    seen = _lines(result)
    for node in injected:
        assert seen[node] == "open", (node, result.stdout)
    assert seen["/probe/gpu"] == "denied", result.stdout
    assert seen["/probe/mem"] == "denied", result.stdout
    assert seen["/dev/null"] == "open" and seen["/dev/zero"] == "open", result.stdout


def _assert_nothing_left(cid: str) -> None:
    """No cgroup directory named after the container, no nvct program loaded, nothing pinned."""
    from nvct.linux import bpf
    from nvct.linux.namespaces import mounts

    find = [*V2_RUNC[:-1], "/bin/sh", "-c", f"find /sys/fs/cgroup -name '{cid}*'"]
    def gone() -> bool:
        proc = subprocess.run(find, capture_output=True, text=True)
        return proc.returncode == 0 and not proc.stdout.strip() and not bpf.loaded_named("nvct_devices")

    # docker removes the container after its client returns, and the kernel frees programs after an RCU grace period
    wait_until(gone, 5, 0.1)
    proc = subprocess.run(find, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc
    assert not bpf.loaded_named("nvct_devices")
    for bpffs in (m.mount_point for m in mounts() if m.fstype == "bpf"):
        pinned = [os.path.join(d, f) for d, _, files in os.walk(bpffs) for f in files if "nvct" in f]
        assert not pinned, pinned


@pytest.mark.parametrize("case", ["all", "1,3", "mig", "none"])
def test_v2_hook_grants_exactly_the_injected_nodes(tmp_path, sim_node, rootfs, v2_runc, case):
    visible, injected = _cases(sim_node)[case]
    command = "grep '^0::' /proc/self/cgroup; " + OPEN + "; nvidia-smi -L; true"
    args = sorted(injected) + ["/probe/gpu", "/probe/mem", "/dev/null", "/dev/zero"]
    bundle, _ = _hook_bundle(tmp_path, sim_node, rootfs, visible, command, args, injected)
    cid, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc == 0, result.describe()
    assert result.stdout.startswith("0::/"), result.stdout  # runc really ran in cgroup v2 mode
    _assert_access(result, injected)
    gpus = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    if case == "1,3":
        assert [g.split("UUID: ")[1].rstrip(")") for g in gpus] == [sim_node["gpus"][i]["uuid"] for i in (1, 3)]
    elif case == "all":
        assert len(gpus) == len(sim_node["gpus"]), result.stdout
    _assert_nothing_left(cid)


def test_v2_runtime_alone_denies_the_gpu(tmp_path, sim_node, rootfs, v2_runc):
    # The bed is faithful: without the hook runc's own filter denies a 195:* node.
    bundle = make_bundle(os.path.join(str(tmp_path), "bundle"), rootfs, ["sh", "-c", OPEN, "sh", "/probe/gpu"])
    _hook_bundle(tmp_path, sim_node, rootfs, "void", "true")  # only for the probe nodes
    bundle = make_bundle(os.path.join(str(tmp_path), "plain"), rootfs, ["sh", "-c", OPEN, "sh", "/probe/gpu"])
    _, result = _run(v2_runc, tmp_path, bundle)
    assert _lines(result) == {"/probe/gpu": "denied"}


def test_v2_hook_failure_reason_reaches_runc_error_line(tmp_path, sim_node, rootfs, v2_runc):
    # docker shows runc's error line: the hook's one-line reason must be in it (and in --log).
    bundle, _ = _hook_bundle(tmp_path, sim_node, rootfs, "1", "true")
    with edit_config(bundle) as spec:
        spec["process"]["env"].append("NVIDIA_REQUIRE_CUDA=cuda>=99.0")
    cid, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc != 0
    line = [ln for ln in result.stderr.splitlines() if "error running hook" in ln]
    assert line and "nvidia-container-runtime-hook: " in line[0] and "99.0" in line[0], result.describe()
    assert "nvidia-container-runtime-hook: " in result.log and "Traceback" not in result.stderr
    _assert_nothing_left(cid)


#: A prestart hook standing for an administrator's or a security agent's device policy: it
#: attaches to the container's cgroup, next to the runtime's, a program in the runtime's own
#: shape (BPF_F_ALLOW_MULTI: every program must allow) that denies char ``major:minor``.
POLICY_HOOK = """#!{python}
import json, os, sys
from nvct.linux import bpf, cgroups
major, minor = (None if x == "*" else int(x) for x in sys.argv[1].split(":"))
jumps = [(2, 2), (4, major)] + ([(5, minor)] if minor is not None else [])  # char, major, minor
checks = [bpf.insn(0x55, reg, off=len(jumps) + 1 - i, imm=value) for i, (reg, value) in enumerate(jumps)]
head = [(0x61, 2, 1, 0), (0x54, 2, 0, 0, 0xFFFF), (0x61, 3, 1, 0), (0x74, 3, 0, 0, 16), (0x61, 4, 1, 4),
        (0x61, 5, 1, 8)]  # type, access, major, minor into r2-r5, as runc, crun and systemd start
code = b"".join(bpf.insn(*i) for i in head) + b"".join(checks) + bpf.insn(0xB7, 0, imm=0) + bpf.insn(0x95) + \\
    bpf.insn(0xB7, 0, imm=1) + bpf.insn(0x95)
directory = cgroups.unified_cgroup_dir(json.load(sys.stdin)["pid"])
cg = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
bpf.attach(cg, bpf.load(code, "site_policy"), bpf.F_ALLOW_MULTI)
"""


def _with_policy(tmp_path, bundle: str, device: str) -> None:
    """The policy hook for ``device`` ('195:*') runs first among the bundle's prestart hooks."""
    import sys

    script = os.path.join(str(tmp_path), "policy-hook")
    with open(script, "w") as f:
        f.write(POLICY_HOOK.format(python=sys.executable))
    os.chmod(script, 0o755)
    with edit_config(bundle) as spec:
        spec["hooks"]["prestart"].insert(0, {"path": script, "args": ["policy-hook", device]})


def test_v2_a_policy_that_denies_the_gpu_is_not_overridden(tmp_path, sim_node, rootfs, v2_runc):
    """A device program someone other than runc attached to the container's cgroup denies 195:*:
    nvct does not rewrite it; the start fails with one line naming it."""
    visible, injected = _cases(sim_node)["1,3"]
    bundle, _ = _hook_bundle(tmp_path, sim_node, rootfs, visible, OPEN, sorted(injected), injected)
    _with_policy(tmp_path, bundle, "195:*")
    cid, result = _run(v2_runc, tmp_path, bundle)
    assert result.rc != 0, result.describe()
    line = [ln for ln in result.stderr.splitlines() if "error running hook" in ln]
    assert line, result.describe()
    assert "nvidia-container-runtime-hook: cgroup v2: device program " in line[0], result.describe()
    assert "(site_policy)" in line[0] and "denies c 195:" in line[0], result.describe()
    assert "a device policy nvct does not override" in line[0] and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one line
    _assert_nothing_left(cid)


def test_v2_a_policy_that_allows_the_gpu_is_kept(tmp_path, sim_node, rootfs, v2_runc):
    """A policy that denies only another device (1:5, /dev/zero, which runc allows): the GPU is
    granted through runc's program, and the policy still denies /dev/zero (never rewritten)."""
    visible, injected = _cases(sim_node)["1,3"]
    args = sorted(injected) + ["/probe/gpu", "/probe/mem", "/dev/null", "/dev/zero"]
    bundle, _ = _hook_bundle(tmp_path, sim_node, rootfs, visible, OPEN, args, injected)
    _with_policy(tmp_path, bundle, "1:5")
    cid, result = _run(v2_runc, tmp_path, bundle)
    seen = _lines(result)
    assert {n: seen[n] for n in injected} == {n: "open" for n in injected}, result.stdout
    assert seen["/dev/zero"] == "denied" and seen["/dev/null"] == "open", result.stdout
    assert seen["/probe/gpu"] == "denied" and seen["/probe/mem"] == "denied", result.stdout
    _assert_nothing_left(cid)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("case", ["all", "1,3", "mig", "none"])
def test_v1_hook_grants_exactly_the_injected_nodes(tmp_path, sim_node, rootfs, gpu_runtimes, runtime, case):
    visible, injected = _cases(sim_node)[case]
    args = sorted(injected) + ["/probe/gpu", "/probe/mem", "/dev/null", "/dev/zero"]
    bundle, _ = _hook_bundle(tmp_path, sim_node, rootfs, visible, OPEN + "; nvidia-smi -L; true", args,
                             injected)
    _, result = _run(RUNTIMES[runtime], tmp_path, bundle)
    _assert_access(result, injected)


@pytest.fixture(scope="module")
def v2_dockerd(tmp_path_factory, sim_node, busybox_image_tar):
    need_root("runs dockerd")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker", RUNTIMES["runc"][0], "/usr/bin/unshare")
    reason = _v2_ok()
    if reason:
        skip(reason)
    from tests.support.docker import Dockerd

    config = node_config(tmp_path_factory.mktemp("docker-v2"), sim_node, mode="legacy")
    # dockerd, its containerd, the shims and runc all see cgroup2 on /sys/fs/cgroup.
    with Dockerd(extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}, path_prefix=(VENV_BIN,),
                 wrapper=V2_RUNC[:-1]) as dockerd:
        dockerd.load(busybox_image_tar)
        yield dockerd


@pytest.mark.parametrize("gpus, indexes", [("all", None), ('"device=1,3"', [1, 3])])
def test_docker_gpus_on_cgroup_v2(tmp_path, v2_dockerd, sim_node, gpus, indexes):
    indexes = range(len(sim_node["gpus"])) if indexes is None else indexes
    injected = expected_nodes(sim_node, indexes, [(0, 0), (0, 1)] if gpus == "all" else [])
    command = ("grep '^0::' /proc/self/cgroup; mknod /probe-gpu c 195 100; mknod /probe-mem c 1 1; "
               + OPEN + "; nvidia-smi -L")
    args = sorted(injected) + ["/probe-gpu", "/probe-mem", "/dev/null", "/dev/zero"]
    cidfile = os.path.join(str(tmp_path), "cid")
    result = v2_dockerd.run(["--rm", "--cidfile", cidfile, "--gpus", gpus, BUSYBOX_IMAGE, "sh", "-c", command,
                             "sh", *args])
    assert result.rc == 0, result.describe()
    assert result.stdout.startswith("0::/"), result.stdout
    seen = _lines(result)
    assert {n for n in injected if seen[n] == "open"} == injected, result.stdout
    assert seen["/probe-gpu"] == "denied" and seen["/probe-mem"] == "denied", result.stdout
    assert seen["/dev/null"] == "open", result.stdout
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in result.stdout.splitlines() if line.startswith("GPU ")]
    assert uuids == [sim_node["gpus"][i]["uuid"] for i in indexes]
    # --rm: once deleted, its cgroup (docker/<id>; the container sees 0::/ in its own cgroup
    # namespace) is gone and no nvct program is loaded or pinned.
    with open(cidfile) as f:
        cid = f.read().strip()
    assert len(cid) == 64, cid
    _assert_nothing_left(cid)
