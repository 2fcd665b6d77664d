"""nvct.hooks.container: the root a hook writes into is the one verified where the runtime runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.support.gpu_runs import NVCT


def test_a_hook_in_the_runtimes_own_mount_namespace_needs_no_identity(tmp_path):
    """The hook's three nearest ancestors share its mount namespace (a chain of shells: the suite
    itself runs in a namespace of its own, tests.support.hostns, unlike the shell that started it)."""
    command = (f"{shlex.quote(sys.executable)} -c 'from nvct.hooks import container; "
               f"print(container.runtime_identity(\"{tmp_path}\", ()))'")
    for _ in range(3):
        command = f"sh -c {shlex.quote(command + '; :')}"
    out = subprocess.run(command, shell=True, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == "None", out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces)")
def test_a_hook_in_another_mount_namespace_refuses_a_directory_mounted_over_the_root(tmp_path):
    """The hook's parent unshared the mount namespace and mounted another directory over the root's
    name: the identity taken from the parent's parent's namespace (the runtime's) refuses it."""
    root, other = tmp_path / "root", tmp_path / "other"
    root.mkdir()
    other.mkdir()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": str(root)}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": str(bundle)})
    hook = [NVCT, "hook", "chain", "create-symlinks", "--link", "t::/link"]
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(other),
                          str(root), *hook], input=state, capture_output=True, text=True, timeout=30)
    assert run.returncode == 1, run
    assert "the runtime set up another directory there than the one verified on the host" in run.stderr
    assert not os.listdir(other) and not os.listdir(root)
    same = subprocess.run(["unshare", "-m", "--propagation", "private", *hook], input=state,
                          capture_output=True, text=True, timeout=30)
    assert same.returncode == 0, same  # the same directory in both views: written
    assert os.readlink(root / "link") == "t"
