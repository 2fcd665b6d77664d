"""crun's state ``root`` is enough for the hook chain: config.json need not be readable (issue 26).

podman ``--userns nomap``/``--userns auto`` (rootless) run a createContainer hook inside the
container's user namespace, where the bundle, owned by an unmapped user, cannot be read (toolkit
#648; the reference's fix, #1971, reads crun's non-standard ``root`` field of the state). Here crun
runs a user-namespaced container (the root's host uid is tests/e2e/test_userns_sandbox.py's) whose
config.json only host root may read: crun, as host root, reads it; the chain it runs in the user
namespace cannot. The chain is what a generated spec's hook runs (``nvct hook chain`` with
the OCI state on stdin): its links appear in the container. runc gives no ``root``; there the
chain still needs config.json and says so in one line.
"""

from __future__ import annotations

import os

import pytest

from tests.e2e.test_userns_sandbox import HOST_ID, _shift, _userns, node, open_tmp, work  # noqa: F401 - fixtures
from tests.support.bundle import edit_config, make_bundle
from tests.support.gpu_runs import NVCT, PATH_ENV, need_runtime
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import RUNTIMES, run_container

pytestmark = pytest.mark.containers

#: The chain's steps: one link, and check-requirements asking for a CUDA the node has (it needs the
#: container's env, which only config.json holds: without it, nothing is asked).
CHAIN = ["check-requirements", "--driver-version", "550.54.15", "--cuda-version", "12.4", "--",
         "create-symlinks", "--link", "libc.so.6::/usr/lib/nvct-probe-link"]


def _bundle(work, runtime: str) -> str:
    root = make_rootfs(work)
    _shift(root, HOST_ID)
    hook = {"path": NVCT, "args": ["nvct", "hook", "chain", *CHAIN], "env": [PATH_ENV]}
    bundle = make_bundle(os.path.join(work, "bundle"), root, ["sh", "-c", "cat /proc/self/uid_map; readlink "
                                                                   "/usr/lib/nvct-probe-link"],
                         env=[PATH_ENV, "NVIDIA_REQUIRE_CUDA=cuda>=12.0"], hooks={"createContainer": [hook]})
    with edit_config(bundle) as spec:
        _userns(spec)
    os.chmod(bundle, 0o711)  # the container's root, where the hook runs, may enter (crun 1.8 runs no hook
    os.chmod(os.path.join(bundle, "config.json"), 0o600)  # otherwise) but not read config.json
    return bundle


def test_crun_the_chain_uses_the_states_root_without_config_json(work):
    need_runtime("crun")
    result = run_container(RUNTIMES["crun"], _bundle(work, "crun"), timeout=60)
    assert result.ok, result.describe()
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["0", str(HOST_ID)], result.describe()  # in the user namespace
    assert lines[-1] == "libc.so.6", result.describe()


def test_runc_gives_no_root_and_the_chain_says_config_json_is_unreadable(work):
    need_runtime("runc")
    result = run_container(RUNTIMES["runc"], _bundle(work, "runc"), timeout=60)
    assert not result.ok, result.describe()
    [line] = [ln for ln in result.stderr.splitlines() if "nvct hook chain" in ln]
    assert "config.json" in line and "Traceback" not in result.stderr, result.describe()
