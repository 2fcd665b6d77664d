"""SIGKILL at a random point of a GPU container's create, then a normal start: nothing left behind.

The shim (its sh front, Python, then runc: one pid) or the legacy prestart
hook is killed after a random delay, as the OOM killer or a timeout would.
The next start of the same bundle and root must work, and afterwards nothing
a killed process wrote may remain: no temporary or half-written file in the
bundle, the container root or /run/nvct, no mount, no lock that blocks (the
follow-up start would hang on it). ``NVCT_KILL_TRIES`` (default 100) sets the
tries per case.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import time

import pytest

from tests.support.bundle import make_bundle, read_config, write_config
from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import PATH_ENV, SHIM, VENV_BIN, mounts_under, need_runtime, node_config
from tests.support.runtimes import RUNC, run_container

pytestmark = pytest.mark.containers

TRIES = int(os.environ.get("NVCT_KILL_TRIES", "100"))
#: Kills land anywhere from the front's first line to runc's create (the shim's Python takes ~30 ms).
MAX_DELAY_S = 0.12
HOOK = os.path.join(VENV_BIN, "nvidia-container-runtime-hook")


def _config(tmp_path, node, mode: str, hook: str | None = None) -> str:
    """The node's config for ``mode`` without a debug log (so legacy mode's sh front appends the hook);
    ``hook``: the legacy hook, or in jit-cdi mode the program of nvct's hook chain."""
    path = node_config(tmp_path, node, mode=mode, runtime=RUNC)
    with open(path) as f:
        text = "".join(line for line in f if not line.startswith("debug = "))
    if hook:
        table = "nvidia-container-runtime-hook" if mode == "legacy" else "nvidia-ctk"
        text += f'\n[{table}]\npath = "{hook}"\n'
    with open(path, "w") as f:
        f.write(text)
    os.utime(path, (time.time() - 60,) * 2)
    return path


def _killer_hook(tmp_path, real: str) -> tuple[str, str, str]:
    """A hook that runs ``real`` and, while ``delay`` exists, SIGKILLs it after that many seconds."""
    delay, pids = str(tmp_path / "hook-delay"), str(tmp_path / "hook-pids")
    os.makedirs(tmp_path / "killer")
    path = str(tmp_path / "killer" / os.path.basename(real))  # nvct's chain is known by the name
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec 3<&0\n{real} "$@" <&3 3<&- &\npid=$!\necho $pid >> {pids}\n'
                f'if [ -f {delay} ]; then sleep "$(cat {delay})"; kill -9 $pid 2>/dev/null; fi\nwait $pid\n')
    os.chmod(path, 0o755)
    return path, delay, pids


#: A temporary name carrying its writer's pid: ``.nvct-<pid>[-<hex>].tmp``, or ``<name>.<pid>.tmp``.
_TEMP = re.compile(r"(?:^\.nvct-|\.)(\d+)(?:-[0-9a-f]+)?\.tmp$")


def _writer(name: str) -> int | None:
    m = _TEMP.search(name)
    return int(m.group(1)) if m else None


def _leftovers(bundle: str, root: str, pids: set[int]) -> list[str]:
    """What killed processes left: temporaries (a killed writer's pid, or the root's ``.<name>.nvct-*``
    and ldconfig's ``~``), in the bundle, the root's /etc and library folders, and /run/nvct; mounts."""
    found = [f"bundle: {n}" for n in os.listdir(bundle) if n not in ("config.json", "nvct-driver-params")]
    for top in ("etc", "usr/lib", "usr/lib64", "lib"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            found += [f"root: {os.path.join(dirpath, n)}" for n in names if ".nvct-" in n or n.endswith("~")]
    for dirpath, _, names in os.walk("/run/nvct"):
        found += [f"/run/nvct: {os.path.join(dirpath, n)}" for n in names if _writer(n) in pids]
    return found + [f"mount: {m}" for m in mounts_under(root)]


def _loop(tmp_path, rootfs: str, config: str, kill) -> tuple[int, list[str], list[str]]:
    """``TRIES`` times: a create killed by ``kill(rng, bundle, cid)`` (the pids it killed), then a normal
    start of the same bundle; (follow-up failures, their first lines, leftovers)."""
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", "dlopen-probe libcuda.so.1"],
                         env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    spec = read_config(bundle)
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": os.environ["PATH"]}
    state = str(tmp_path / "state")
    rng = random.Random(os.environ.get("NVCT_KILL_SEED", "nvct"))
    failures, why, killed = 0, [], set()
    for i in range(TRIES):
        write_config(bundle, spec)  # the engine's spec, as every create gets it
        cid = f"kill-{i}"
        killed |= kill(rng, bundle, cid, env, state)
        subprocess.run([RUNC, "--root", state, "delete", "--force", cid], capture_output=True, timeout=30)
        write_config(bundle, spec)
        result = run_container([SHIM], bundle, env=env, timeout=60)
        if not (result.ok and result.stdout.startswith("ok libcuda.so.1 /")):
            failures += 1
            why.append(result.stderr.splitlines()[0] if result.stderr else result.describe())
    # A shim killed while its runtime child creates leaves that child to finish after the delete above:
    # a created container the engine's later delete would take (docs/security.md). Take it here.
    for cid in os.listdir(state) if os.path.isdir(state) else ():
        subprocess.run([RUNC, "--root", state, "delete", "--force", cid], capture_output=True, timeout=30)
    return failures, why[:3], _leftovers(bundle, rootfs, killed)


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
def test_shim_killed_anywhere_leaves_nothing(tmp_path, sim_node, rootfs, mode):
    need_runtime("runc")
    config = _config(tmp_path, sim_node, mode)

    def kill(rng, bundle, cid, env, state):
        proc = subprocess.Popen([SHIM, "--root", state, "create", "--bundle", bundle, cid], env=env, cwd=bundle,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(rng.uniform(0, MAX_DELAY_S))  # a random point of its work, not a synchronisation
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return {proc.pid}

    failures, why, left = _loop(tmp_path, rootfs, config, kill)
    assert failures == 0 and not left, (failures, why, len(left), left[:5])


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_hook_killed_anywhere_leaves_nothing(tmp_path, sim_node, rootfs, mode):
    """legacy mode's prestart hook; jit-cdi's hook chain, left to the hook by an image without an ld
    cache (ldconfig writes one in the root)."""
    need_runtime("runc")
    hook, delay, pids = _killer_hook(tmp_path, HOOK if mode == "legacy" else os.path.join(VENV_BIN, "nvct"))
    config = _config(tmp_path, sim_node, mode, hook=hook)
    runs = []

    def kill(rng, bundle, cid, env, state):
        if mode == "jit-cdi" and os.path.exists(os.path.join(rootfs, "etc/ld.so.cache")):
            os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))  # the last follow-up's ldconfig wrote one
        if os.path.exists(pids):
            os.unlink(pids)  # the last follow-up's
        with open(delay, "w") as f:
            f.write(f"{rng.uniform(0, MAX_DELAY_S):.3f}\n")
        try:
            subprocess.run([SHIM, "--root", state, "create", "--bundle", bundle, cid], env=env, cwd=bundle,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=60)  # no pipes: a created container's init holds them
        finally:
            os.unlink(delay)
        with open(pids) as f:
            ran = {int(line) for line in f if line.strip()}
        runs.append(len(ran))
        return ran

    failures, why, left = _loop(tmp_path, rootfs, config, kill)
    assert failures == 0 and not left, (failures, why, len(left), left[:5])
    assert runs == [1] * TRIES  # the hook ran (and was killed or not) in every try
