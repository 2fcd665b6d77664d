"""The prestart hook and the in-container hook subcommands as processes."""

import json
import os
import subprocess
import sys

import pytest

BIN = os.path.dirname(sys.executable)
HOOK = os.path.join(BIN, "nvidia-container-runtime-hook")
NVCT = os.path.join(BIN, "nvct")


def run(argv, stdin="", env=None):
    return subprocess.run(argv, input=stdin, capture_output=True, text=True,
                          env=env or {"PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("stage", ["poststart", "poststop"])
def test_poststart_and_poststop_do_nothing(stage):
    r = run([HOOK, stage], stdin="not even json")
    assert (r.returncode, r.stderr) == (0, "")


@pytest.mark.parametrize("stage", ["poststart", "poststop"])
def test_poststart_and_poststop_read_the_state_to_its_end(stage):
    # crun writes the state after the hook started and fails the start on EPIPE if it has exited
    read, write = os.pipe()
    os.write(write, b'{"id": "x"}')
    os.close(write)
    try:
        r = subprocess.run([HOOK, stage], stdin=read, capture_output=True, env={"PATH": "/usr/bin:/bin"})
        os.set_blocking(read, False)
        assert (r.returncode, os.read(read, 100)) == (0, b"")
    finally:
        os.close(read)


@pytest.mark.containers
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_poststart_and_poststop_hooks_leave_every_start_alone(tmp_path, rootfs, runtime):
    """Named for those stages (as a hooks.d file may), through the real runtime, start after start."""
    from tests.support.bundle import make_bundle
    from tests.support.gpu_runs import PATH_ENV, need_runtime
    from tests.support.runtimes import RUNTIMES, run_container

    need_runtime(runtime)
    entry = {"path": HOOK, "env": ["PATH=/usr/bin:/bin"]}
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", "echo ran"], env=[PATH_ENV],
                         hooks={stage: [{**entry, "args": [HOOK, stage]}] for stage in ("poststart", "poststop")})
    results = [run_container(RUNTIMES[runtime], bundle) for _ in range(10)]
    assert [(r.rc, r.stdout, r.stderr) for r in results] == [(0, "ran\n", "")] * 10, results[0].describe()


def test_usage_error():
    r = run([HOOK, "bogus"])
    assert r.returncode == 2 and "usage:" in r.stderr


def _bundle(tmp_path, env):
    (tmp_path / "rootfs").mkdir()
    spec = {"ociVersion": "1.0.2", "process": {"env": env}, "root": {"path": "rootfs"}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return tmp_path


def test_prestart_without_gpu_request_does_nothing(tmp_path):
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    r = run([HOOK, "prestart"], stdin=json.dumps({"id": "x", "pid": 1, "bundle": str(bundle)}))
    assert (r.returncode, r.stderr) == (0, "")


@pytest.mark.parametrize("state, message", [
    ("{", "OCI state on stdin is not JSON"),
    ('{"id": "x"}', "OCI state on stdin names no bundle"),
])
def test_prestart_bad_state_is_one_line(state, message):
    r = run([HOOK, "prestart"], stdin=state)
    assert r.returncode == 1
    assert r.stderr.startswith("nvidia-container-runtime-hook: ") and message in r.stderr
    assert r.stderr.count("\n") == 1


def test_prestart_accepts_old_bundlepath_and_reports_missing_pid(tmp_path):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    r = run([HOOK, "prestart"], stdin=json.dumps({"id": "x", "bundlePath": str(bundle)}))
    assert r.returncode == 1 and "OCI state on stdin has no container pid" in r.stderr


def test_image_env_is_never_the_hooks_env(tmp_path):
    # LD_PRELOAD in the image's env is data in config.json to the hook, never its own env:
    # a library that does not exist would make any process it reached fail to start.
    bundle = _bundle(tmp_path, ["LD_PRELOAD=/nonexistent/evil.so", "NVIDIA_VISIBLE_DEVICES=void"])
    r = run([HOOK, "prestart"], stdin=json.dumps({"id": "x", "pid": 1, "bundle": str(bundle)}))
    assert (r.returncode, r.stderr) == (0, "")


def test_unknown_hook_warns_and_exits_0(tmp_path):
    bundle = _bundle(tmp_path, [])
    r = run([NVCT, "hook", "future-hook", "--x", "1"], stdin=json.dumps({"bundle": str(bundle)}))
    assert r.returncode == 0
    assert "unknown hook 'future-hook', ignored" in r.stderr


def test_create_symlinks_inside_the_root(tmp_path):
    bundle = _bundle(tmp_path, [])
    state = json.dumps({"bundle": str(bundle), "pid": 0})
    r = run([NVCT, "hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"],
            stdin=state)
    assert r.returncode == 0, r.stderr
    assert os.readlink(bundle / "rootfs/usr/lib/x86_64-linux-gnu/libcuda.so") == "libcuda.so.1"
    r = run([NVCT, "hook", "create-symlinks", "--link", "bad-no-separator"], stdin=state)
    assert r.returncode == 1 and "invalid --link 'bad-no-separator'" in r.stderr


def test_chain_runs_steps_in_order_and_chmod_validates_mode(tmp_path):
    bundle = _bundle(tmp_path, [])
    (bundle / "rootfs/dev/dri").mkdir(parents=True)
    (bundle / "rootfs/dev/dri").chmod(0o700)
    state = json.dumps({"bundle": str(bundle)})
    r = run([NVCT, "hook", "chain", "create-symlinks", "--link", "a::/x/b", "--", "chmod", "--mode", "755",
             "--path", "/dev/dri"], stdin=state)
    assert r.returncode == 0, r.stderr
    assert os.readlink(bundle / "rootfs/x/b") == "a"
    assert (bundle / "rootfs/dev/dri").stat().st_mode & 0o777 == 0o755
    r = run([NVCT, "hook", "chmod", "--mode", "9z", "--path", "/dev/dri"], stdin=state)
    assert r.returncode == 1 and "invalid --mode '9z'" in r.stderr


def test_hook_never_imports_from_pythonpath(tmp_path):
    # A PYTHONPATH in a hook's environment (an engine's, or a failed seal's) is set aside by the
    # sh front: no code runs from there, and the hook runs (started by sh, or re-exec'd through it).
    evil = tmp_path / "evil" / "nvct"
    evil.mkdir(parents=True)
    (evil / "__init__.py").write_text('raise SystemExit("imported from PYTHONPATH")\n')
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "nvct/scripts/nvidia-container-runtime-hook")
    for argv in ([HOOK, "poststart"], [sys.executable, script, "poststart"]):  # with and without -I
        r = run(argv, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "evil")})
        assert (r.returncode, r.stderr) == (0, ""), argv


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount)")
def test_bind_mount_step_mounts_a_host_dir_with_its_options_and_refuses_bad_input(tmp_path):
    from nvct.linux import fs
    from nvct.linux.namespaces import in_private_mount_namespace

    bundle = _bundle(tmp_path, [])
    mps = tmp_path / "host-mps"
    mps.mkdir()
    (mps / "control").write_text("pipe")
    volume = tmp_path / "volume"
    (volume / "mps").mkdir(parents=True)
    (bundle / "rootfs/data").mkdir()
    (bundle / "rootfs/tmp").mkdir()
    os.symlink("/data/mps", bundle / "rootfs/tmp/linked")
    state = json.dumps({"bundle": str(bundle)})
    step = [NVCT, "hook", "bind-mount", "--host-path", str(mps), "--options", "nosuid,nodev,noexec,rbind,rprivate"]

    def work():
        fs.mount(str(volume), str(bundle / "rootfs/data"), None, fs.MS_BIND)
        ok = run(step + ["--container-path", "/tmp/nvidia-mps"], stdin=state)
        point = str(bundle / "rootfs/tmp/nvidia-mps")
        lines = [m for m in open("/proc/self/mountinfo").read().splitlines() if f" {point} " in m]
        return (ok.returncode, ok.stderr, os.listdir(point), [line.split()[5] for line in lines],
                [run(step[:3] + args, stdin=state) for args in (
                    ["--host-path", "tmp/x", "--container-path", "/x"],
                    ["--host-path", str(mps), "--container-path", "/y", "--options", "rw,shared"],
                    ["--host-path", str(mps), "--container-path", "/tmp/linked"])])

    rc, stderr, names, options, failures = in_private_mount_namespace(work)
    assert (rc, stderr, names) == (0, "", ["control"])
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(options[0].split(","))
    messages = ["--host-path 'tmp/x' is not an absolute path", "unknown mount option 'shared'",
                "/tmp/linked in container root"]
    for r, message in zip(failures, messages):
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "onto another mount (/data" in failures[2].stderr
    assert os.listdir(volume / "mps") == []  # nothing mounted or created in the volume through the link


@pytest.mark.parametrize("how", ["container-root", "state root", "spec root"])
def test_a_root_reached_through_a_symlink_gets_nothing_written(tmp_path, how):
    """The hook opens the root once, following no link (runc's rule): a link's target stays as it was."""
    bundle = _bundle(tmp_path, [])
    (tmp_path / "link").symlink_to(bundle / "rootfs")
    step = ["create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"]
    if how == "container-root":
        r = run([NVCT, "hook", "chain", "--container-root", str(tmp_path / "link"), *step])
    elif how == "state root":
        r = run([NVCT, "hook", *step], stdin=json.dumps({"bundle": str(bundle), "root": str(tmp_path / "link")}))
    else:
        spec = json.loads((bundle / "config.json").read_text())
        spec["root"]["path"] = str(tmp_path / "link")
        (bundle / "config.json").write_text(json.dumps(spec))
        r = run([NVCT, "hook", *step], stdin=json.dumps({"bundle": str(bundle)}))
    assert r.returncode == 1
    assert r.stderr == (f"nvct hook {'chain' if how == 'container-root' else step[0]}: container root "
                        f"{tmp_path / 'link'}: its path leads through a symlink (runc refuses such a root); "
                        "refusing to write into it\n")
    assert not (bundle / "rootfs/usr/lib/libcuda.so").is_symlink()
