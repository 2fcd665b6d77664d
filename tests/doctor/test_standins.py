"""toolkit.standins against a real containerd: a stand-in a running container needs is ``info``; one
that no process names is named, and its fix (``nvct toolkit prune-standins``) removes it when run."""

from __future__ import annotations

import os
import subprocess

import pytest

from nvct import doctor
from nvct.toolkit import standin
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries
from tests.support.gpu_runs import SHIM, VENV_BIN, need_runtime
from tests.support.proc import wait_for

from .nodes import GpuNode, by_id

pytestmark = pytest.mark.containers

GPU = 3


def _wrapper(path: str, config: str) -> None:
    """A toolkit's runtime wrapper: the shim with the node's config (what the installer writes, minus Python)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nNVIDIA_CTK_CONFIG_FILE_PATH={config} exec {SHIM} \"$@\"\n")
    os.chmod(path, 0o755)


def _stopped(containerd, cid: str) -> bool:
    tasks = containerd.ctr(["task", "ls"]).check().stdout
    return "STOPPED" in next((line for line in tasks.splitlines() if line.split()[:1] == [cid]), "")


def _prune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(VENV_BIN, "nvct"), "toolkit", "prune-standins", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_needed_stand_in_is_info_and_a_stale_one_is_pruned(tmp_path, busybox_image_tar):
    need_runtime("runc")
    need_binaries("/usr/bin/containerd", "/usr/bin/ctr")
    from tests.support.containerd import Containerd

    node = GpuNode(tmp_path, real=True)
    toolkit = os.path.join(node.tmp, "toolkit")
    runtime = os.path.join(toolkit, "nvidia-container-runtime")
    _wrapper(runtime, node.config)
    # a stand-in whose container went outside its engine (nothing names it): made by hand
    stale = os.path.join(node.tmp, "old-toolkit", "nvidia-container-runtime")
    os.makedirs(os.path.dirname(stale))
    with open(stale, "w") as f:
        f.write(standin.script(stale, ["runc"]))
    os.chmod(stale, 0o755)
    options = dict(toolkit_dirs=(toolkit, os.path.dirname(stale)))
    uuid = f"UUID: {node.manifest['gpus'][GPU]['uuid']}"

    with Containerd() as containerd:
        containerd.import_image(busybox_image_tar)
        cid = "standin-doctor"
        containerd.ctr(["run", "-d", "--runc-binary", runtime, "--env", f"NVIDIA_VISIBLE_DEVICES={GPU}",
                        BUSYBOX_IMAGE_QUALIFIED, cid, "sleep", "3600"]).check()
        seen = containerd.ctr(["task", "exec", "--exec-id", "probe", cid, "nvidia-smi", "-L"]).check()
        assert uuid in seen.stdout, seen.describe()

        # the toolkit goes while the container runs: a stand-in is left at its runtime path
        assert standin.remove_toolkit(toolkit, [runtime], standin.config_runtimes(node.config), print) == [runtime]
        findings = node.doctor(**options)
        report = doctor.render_text(findings)
        got = {f.seen.split()[0]: f for f in by_id(findings, "toolkit.standins")}
        assert got[runtime].status == "info" and "still need it" in got[runtime].seen, report
        assert got[stale].status == "warn" and "no process names it" in got[stale].seen, report
        command, _, without = got[stale].fix.partition(" (where nvct is gone too: ")
        assert command == f"nvct toolkit prune-standins {stale}" and without == f"{stale} --nvct-prune)", report
        assert doctor.exit_code([f for f in findings if f.id == "toolkit.standins"]) == 0

        # the fix, as printed, removes the stale one (and its empty directory); the needed one stays
        proc = subprocess.run(["sh", "-ec", command.replace("nvct ", f"{VENV_BIN}/nvct ", 1)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout == f"removed {stale}\n", proc
        assert not os.path.exists(os.path.dirname(stale))
        kept = _prune(toolkit)
        assert kept.returncode == 0 and kept.stdout.startswith(f"kept {runtime}: "), kept
        after = by_id(node.doctor(**options), "toolkit.standins")
        assert [(f.status, f.seen.split()[0]) for f in after] == [("info", runtime)], doctor.render_text(after)

        # the container can still be stopped and deleted through the stand-in, which then goes
        containerd.ctr(["task", "kill", "-s", "KILL", cid]).check()
        wait_for(lambda: _stopped(containerd, cid), f"task {cid} stopped",
                 detail=lambda: containerd.ctr(["task", "ls"]).stdout)
        containerd.ctr(["task", "rm", cid]).check()
        containerd.ctr(["container", "rm", cid]).check()
    assert not os.path.exists(toolkit)
    assert [f.status for f in by_id(node.doctor(**options), "toolkit.standins")] == ["ok"]


def test_without_nvct_a_stale_stand_in_prunes_itself(tmp_path):
    """The fix's other half, for a node where nvct is gone too: the stand-in's own --nvct-prune."""
    path = tmp_path / "toolkit" / "nvidia-container-runtime"
    path.parent.mkdir()
    path.write_text(standin.script(str(path), ["runc"]))
    path.chmod(0o755)
    proc = subprocess.run(["sh", "-ec", f"{path} --nvct-prune"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and not path.parent.exists(), proc


def test_prune_refuses_what_is_not_a_stand_in(tmp_path):
    program = tmp_path / "nvidia-container-runtime"
    program.write_text("#!/bin/sh\nexec runc \"$@\"\n")
    proc = _prune(str(program))
    assert proc.returncode == 1 and proc.stderr == f"nvct: {program}: not a stand-in of nvct (nothing removed)\n"
    assert program.exists()
    # a link to a stand-in is not one (prune never follows a link out of the directory it was given)
    target = tmp_path / "real"
    target.write_text(standin.script(str(target), ["runc"]))
    os.symlink(target, tmp_path / "link")
    assert _prune(str(tmp_path / "link")).returncode == 1 and target.exists()
