from __future__ import annotations

import json
import shutil

import pytest

from tests.support.bundle import add_hook, make_bundle
from tests.support.proc import run, short_tempdir
from tests.support.rootfs import PROBE
from tests.support.runtimes import create_start_delete, run_container

pytestmark = pytest.mark.containers


def _bundle(tmp_path, rootfs, args, **kwargs) -> str:
    return make_bundle(tmp_path, rootfs, args, **kwargs)


def test_runs_a_shell_and_captures_output_and_exit_status(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path, rootfs, ["sh", "-c", "echo hi; echo oops >&2; exit 3"])
    result = run_container(oci_runtime, bundle)
    assert (result.rc, result.stdout, result.stderr) == (3, "hi\n", "oops\n")


def test_dlopen_probe_in_a_container(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path, rootfs, [PROBE, "libc.so.6", "libnvct-missing.so.1"])
    result = run_container(oci_runtime, bundle)
    assert result.rc == 1, result.describe()
    assert result.stdout.splitlines() == [
        "ok libc.so.6 /lib/x86_64-linux-gnu/libc.so.6",
        "fail libnvct-missing.so.1 libnvct-missing.so.1: cannot open shared object file: "
        "No such file or directory"]


def test_prestart_hook_gets_the_state_on_stdin(oci_runtime, rootfs, tmp_path):
    hook = tmp_path / "hook.sh"
    hook.write_text('#!/bin/sh\n/bin/cat > "$1"\n')
    hook.chmod(0o755)
    state_file = tmp_path / "state.json"
    bundle = _bundle(tmp_path / "b", rootfs, ["true"])
    add_hook(bundle, "prestart", str(hook), args=["hook", str(state_file)])
    cid = "nvct-hook-state"
    result = run_container(oci_runtime, bundle, cid)
    assert result.ok, result.describe()
    state = json.loads(state_file.read_text())
    assert state["id"] == cid and state["bundle"] == bundle and state["pid"] > 0


def test_create_container_hook_writes_into_the_rootfs_before_the_process(
        oci_runtime, rootfs, tmp_path):
    hook = tmp_path / "inject.sh"
    # reads its state first: crun fails the start ("writing to pipe: Broken pipe") when a hook
    # exits before crun has written the state, a race under load
    hook.write_text('#!/bin/sh\ncat > /dev/null\necho injected > "$1/etc/marker"\n')
    hook.chmod(0o755)
    bundle = _bundle(tmp_path / "b", rootfs, ["cat", "/etc/marker"])
    add_hook(bundle, "createContainer", str(hook), args=["inject", rootfs])
    result = run_container(oci_runtime, bundle)
    assert (result.rc, result.stdout) == (0, "injected\n"), result.describe()


def test_failure_is_in_the_json_log(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path / "b", rootfs, ["/nonexistent"])
    log_file = str(tmp_path / "log.json")
    result = run_container(oci_runtime, bundle, log_file=log_file)
    assert result.rc != 0
    last = json.loads(result.log.strip().splitlines()[-1])
    assert last["level"] == "error" and "/nonexistent" in last["msg"]


def test_timeout_kills_and_deletes_the_container(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path / "b", rootfs, ["sleep", "60"])
    root = short_tempdir("nvct-rt-test-")
    try:
        result = run_container(oci_runtime, bundle, root=root, timeout=1)
        assert result.timed_out and not result.ok
        listing = run([*oci_runtime, "--root", root, "list", "-q"])
        assert listing.ok and listing.stdout.strip() == ""
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_create_start_delete_times_each_step(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path, rootfs, ["sh", "-c", "echo bench; exit 7"])
    result = create_start_delete(oci_runtime, bundle)
    assert (result.rc, result.stdout) == (7, "bench\n"), result.describe()
    assert set(result.timings) == {"create", "start", "wait", "delete", "total"}
    assert all(t >= 0 for t in result.timings.values())


def test_create_failure_reports_the_runtime_error(oci_runtime, rootfs, tmp_path):
    bundle = _bundle(tmp_path, rootfs, ["/nonexistent"])
    result = create_start_delete(oci_runtime, bundle)
    assert result.rc != 0 and "/nonexistent" in result.stderr
