"""Stand-ins at the runtime paths of a removed toolkit (the real engines: test_e2e_operator_sequence)."""

from __future__ import annotations

import json
import os
import subprocess

from nvct.toolkit import standin
from nvct.toolkit.layout import Layout


def _fake_proc(tmp_path, shims: dict) -> str:
    """A /proc whose processes are shims in bundles whose options.json names ``binary``."""
    proc = tmp_path / "proc"
    for pid, binary in shims.items():
        bundle = tmp_path / f"bundle-{pid}"
        bundle.mkdir()
        (bundle / "options.json").write_text(json.dumps({"binary_name": binary}))
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"/usr/bin/containerd-shim-runc-v2\0-id\0x\0")
        os.symlink(bundle, proc / str(pid) / "cwd")
    return str(proc)


def test_processes_are_matched_by_the_runtime_their_shim_recorded(tmp_path):
    proc = _fake_proc(tmp_path, {101: "/opt/t/nvidia-container-runtime", 102: "/usr/sbin/runc"})
    assert standin.referencing(["/opt/t/nvidia-container-runtime", "/opt/t/nvidia-container-runtime.cdi"],
                               proc) == {"/opt/t/nvidia-container-runtime": [101]}


def test_the_stand_in_passes_calls_through_and_refuses_create(tmp_path):
    fake = tmp_path / "fake-runc"
    fake.write_text('#!/bin/sh\necho "runc $*"\n')
    fake.chmod(0o755)
    path = tmp_path / "nvidia-container-runtime"
    path.write_text(standin.script(str(path), ["/nonexistent/runc", str(fake)]))
    path.chmod(0o755)
    for argv in (["--root", "/r", "kill", "id", "KILL"], ["--log", "create", "state", "id"]):
        out = subprocess.run([str(path), *argv], capture_output=True, text=True)
        assert (out.returncode, out.stdout) == (0, f"runc {' '.join(argv)}\n"), out
    log = tmp_path / "log.json"
    out = subprocess.run([str(path), "--root", "/r", "--log", str(log), "--log-format", "json", "create",
                          "--bundle", ".", "id"], capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"{path}: nvct was removed from this node; this stand-in only stops and deletes the " \
                         f"containers it left running (install nvct again to start GPU containers)\n"
    assert json.loads(log.read_text())["level"] == "error"
    # a delete that leaves no process naming the stand-in takes it (and its empty directory) away
    out = subprocess.run([str(path), "--root", "/r", "delete", "id"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "runc --root /r delete id\n"), out
    assert not path.exists()


def test_without_running_containers_the_directory_goes_whole(tmp_path):
    layout = Layout(str(tmp_path / "toolkit"))
    os.makedirs(layout.config_dir)
    for path in layout.runtimes().values():
        open(path, "w").close()
    assert standin.remove_toolkit(layout.root, list(layout.runtimes().values()), ["runc"], print) == []
    assert not os.path.exists(layout.root)


def test_prune_keeps_what_a_process_names(tmp_path, monkeypatch):
    root = tmp_path / "toolkit"
    root.mkdir()
    kept, gone = str(root / "nvidia-container-runtime"), str(root / "nvidia-container-runtime.cdi")
    for path in (kept, gone):
        with open(path, "w") as f:
            f.write(standin.script(path, ["runc"]))
    (root / "unrelated").write_text("#!/bin/sh\n")
    monkeypatch.setattr(standin, "referencing", lambda paths: {kept: [7]} if kept in paths else {})
    assert standin.prune(str(root)) == [gone]
    assert sorted(os.listdir(root)) == ["nvidia-container-runtime", "unrelated"]


def test_the_next_install_replaces_the_stand_ins(tmp_path, monkeypatch):
    import sys

    from nvct.toolkit import Installation, Options

    opts = Options(install_dir=str(tmp_path / "install"), driver_root="/", python=sys.executable, host_root="/",
                   no_runtime_config=True)
    first = Installation(opts, lambda _m: None)
    first.install()
    runtime = first.layout.runtime()
    monkeypatch.setattr(standin, "referencing", lambda paths: {runtime: [7]})
    first.uninstall()
    assert standin.standins(first.layout.root) == [runtime]
    assert os.listdir(first.layout.root) == ["nvidia-container-runtime"]
    monkeypatch.undo()
    second = Installation(opts, lambda _m: None)
    second.install()
    assert standin.standins(second.layout.root) == []
    with open(runtime) as f:
        assert "nvct toolkit install" in f.read()
    second.uninstall()
    assert not os.path.exists(second.layout.root)
