"""A container root whose path a non-root user controls, through the real runtimes.

``root.path`` under a directory an unprivileged user owns (podman's
``--rootfs ~/rootfs`` run by root, or any engine whose root path has such a
directory): the owner swaps the root with a symlink to a host directory
(renameat2 RENAME_EXCHANGE in a loop) while root starts GPU containers, or
with a directory of her own. A ``root.path`` that simply is a symlink (or has
one in its path) is the same without the race. The shim and the hooks write
through one root opened once, without following a symlink in any component,
and owned as the engine would own it: the host tree (a full root the writes
would fit in) and the owner's own directory must stay exactly as they were,
and nothing may stay mounted. The race and the chain hook's case run through
the project's venv (a pip install) in every mode, and in jit-cdi and cdi mode,
with fewer starts, through the runtime wrappers of a toolkit installed with
``nvct toolkit install`` (its own copy of nvct, its bundled Python, its hook
wrappers) and through the programs of the project's .deb installed with dpkg
in a private root (Debian's python3, the package's config).
"""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from tests.security.conftest import snapshot
from tests.support.bundle import read_config
from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, refusal, run_gpu
from tests.support.rootfs import make_rootfs
from tests.support.toolkit_runs import INSTALLS, TOOLKIT_MODES, enter, hook_program, installs, mounts_left, starter

pytestmark = pytest.mark.containers

#: The unprivileged owner of the root's parent directory (no account needed).
OWNER = 4242
#: Starts per runtime while the owner swaps: 60 per mode (runc's and crun's together).
STARTS = 30
#: Through a toolkit or the .deb: starts per runtime and decoy (the venv's cases cover the count the issue
#: asks for).
TOOLKIT_STARTS = {"link": 10, "own": 8}
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _owned_parent(tmp_path, rootfs: str) -> str:
    """``tmp_path/alice`` (the owner's, 0755) now holding the root-owned root."""
    parent = tmp_path / "alice"
    parent.mkdir()
    os.chown(parent, OWNER, OWNER)
    os.rename(rootfs, parent / "rootfs")
    return str(parent)


def _swapper(parent: str, other: str) -> int:
    """A child that, as OWNER, exchanges ``parent/rootfs`` and ``parent/other`` forever.

    Returns once the first exchange has been made (read from a pipe: no sleep).
    """
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            fd = os.open(parent, os.O_PATH | os.O_DIRECTORY)  # its ancestors are root's 0700
            os.setgroups([])
            os.setresgid(OWNER, OWNER, OWNER)
            os.setresuid(OWNER, OWNER, OWNER)
            os.nice(19)  # it spins: the starts come first
            a, b = b"rootfs", other.encode()
            first = True
            while True:
                if _libc.renameat2(fd, a, fd, b, _RENAME_EXCHANGE) == 0 and first:
                    os.write(ready_w, b"1")
                    os.close(ready_w)
                    first = False
        finally:
            os._exit(1)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"1", "the owner could not swap the root"
    except BaseException:
        _stop(pid)
        raise
    finally:
        os.close(ready_r)
    return pid


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _decoy(tmp_path, parent: str, kind: str) -> tuple[str, str]:
    """(the name swapped with ``rootfs``, the directory no write may reach)."""
    if kind == "link":  # a full root on the host, so every write would fit
        host = make_rootfs(tmp_path, name="host")
        os.symlink(host, os.path.join(parent, "evil"))
        return "evil", host
    own = make_rootfs(parent, name="own")  # the owner's directory, holding a root too
    os.chown(own, OWNER, OWNER)
    return "own", own


def _cases(modes_of: dict):
    """(install, *rest) per install kind: the venv's ids as before, the others' prefixed with the kind."""
    for install in INSTALLS:
        for rest in modes_of.get(install, ()):
            prefix = "" if install == "venv" else f"{install}-"
            yield pytest.param(install, *rest, id=prefix + "-".join(rest))


_SWAPS = {install: [(decoy, mode, runtime) for decoy in ("link", "own")
                    for mode in (MODES if install == "venv" else TOOLKIT_MODES) for runtime in ("runc", "crun")]
          for install in INSTALLS}


@pytest.mark.parametrize("install, decoy, mode, runtime", _cases(_SWAPS))
def test_root_swapped_by_its_owner_never_leads_a_write_out(request, tmp_path, sim_node, rootfs, install, runtime,
                                                           mode, decoy):
    need_runtime(runtime)
    kits = installs(request, install)
    start = starter(install, kits)
    parent = _owned_parent(tmp_path, rootfs)
    name, guarded = _decoy(tmp_path, parent, decoy)
    before, identity = snapshot(guarded), os.lstat(guarded).st_ino
    starts = (STARTS if decoy == "link" else 8) if install == "venv" else TOOLKIT_STARTS[decoy]
    results = []
    swapper = _swapper(parent, name)
    try:
        for i in range(starts):
            results.append(start(tmp_path, sim_node, os.path.join(parent, "rootfs"), mode=mode, runtime=runtime,
                                 env=["NVIDIA_VISIBLE_DEVICES=0"], command="dlopen-probe libcuda.so.1",
                                 name=f"b{i}"))
    finally:
        _stop(swapper)
    if os.lstat(guarded).st_ino != identity:  # the owner's directory, stopped while swapped: swap it back
        assert _libc.renameat2(-100, os.path.join(parent, "rootfs").encode(), -100,
                               os.path.join(parent, name).encode(), _RENAME_EXCHANGE) == 0
    assert not nvct_writes(before, snapshot(guarded), mode), sum(r.ok for r in results)
    assert not mounts_left(str(tmp_path), install, kits, runtime)
    for result in results:
        if result.ok:  # it ran in the real root, with its GPU
            assert result.stdout.startswith("ok libcuda.so.1 /"), result.describe()
        elif not result.stdout.startswith("fail libcuda.so.1"):  # the runtime lost the race: the swapped-in root
            refusal(result, tmp_path)


@pytest.mark.parametrize("install, mode, runtime", _cases(
    {install: [(mode, runtime) for mode in TOOLKIT_MODES for runtime in ("runc", "crun")]
     for install in INSTALLS if install != "venv"}))
def test_a_root_under_its_owners_directory_nobody_swaps_gets_its_gpu(request, tmp_path, sim_node, rootfs, install,
                                                                     mode, runtime):
    """The swap cases' control, through each install: what they refuse is the owner's swap, not a broken
    install (the venv's own swap cases always have starts that win the race)."""
    need_runtime(runtime)
    kits = installs(request, install)
    parent = _owned_parent(tmp_path, rootfs)
    result = starter(install, kits)(tmp_path, sim_node, os.path.join(parent, "rootfs"), mode=mode,
                                    runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                                    command="test -c /dev/nvidia0 && dlopen-probe libcuda.so.1")
    assert result.ok and result.stdout.startswith("ok libcuda.so.1 /"), result.describe()
    assert '"container start"' in (tmp_path / "nvct.log").read_text()  # the install's runtime, its config
    hooks = {hook["path"] for stage in read_config(tmp_path / "bundle").get("hooks", {}).values() for hook in stage}
    assert hooks <= {kits(runtime).tool("nvct"), "/bin/sh"}, hooks  # its own programs (or an sh params mask)
    assert not mounts_left(str(tmp_path), install, kits, runtime)


def nvct_writes(before: dict, after: dict, mode: str) -> list[str]:
    """What changed in a guarded tree that nvct could have written, not the runtime.

    The runtime resolves root.path again after nvct, so when it loses the race
    itself it runs the container in the swapped-in directory and makes its
    own changes there: /dev, mount points (directories; empty files for spec
    mounts in jit-cdi and cdi mode), a moved directory's times. nvct writes
    symlinks (the driver links), files with content (the ld cache, its conf
    file) and, as the legacy hook, the empty targets of its bind mounts.
    """
    found = []
    for path in sorted(set(after) | set(before)):
        if after.get(path) == before.get(path) or path == "dev" or path.startswith("dev/"):
            continue
        kind = (after.get(path) or before[path])[0]
        if kind == 0o040000:  # a directory: made or touched by the runtime (mount points)
            continue
        old, new = before.get(path), after.get(path)
        if (kind == 0o100000 and old is None and new[4] == 0 and mode != "legacy"):
            continue  # an empty mount target the runtime made for a spec mount
        found.append(path)
    return found


def _symlinked(tmp_path, rootfs: str, kind: str) -> str:
    """root.path (as the spec will hold it) leading to ``rootfs`` through a symlink."""
    if kind == "absolute":
        os.symlink(rootfs, tmp_path / "link")
        return str(tmp_path / "link")
    if kind == "relative":  # "rootfs" in the bundle: runc joins it to the bundle's path
        os.makedirs(tmp_path / "bundle")
        os.symlink(rootfs, tmp_path / "bundle/rootfs")
        return str(tmp_path / "bundle/rootfs")
    os.symlink(tmp_path, tmp_path / "via")  # a parent directory's link
    return str(tmp_path / "via" / os.path.basename(rootfs))


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["absolute", "relative", "parent"])
def test_a_symlinked_root_path_gets_nothing_written_in_its_target(tmp_path, sim_node, runtime, mode, kind):
    need_runtime(runtime)
    host = make_rootfs(tmp_path, name="host")
    before = snapshot(host)
    path = _symlinked(tmp_path, host, kind)
    result = run_gpu(tmp_path, sim_node, path, mode=mode, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="dlopen-probe libcuda.so.1")
    assert snapshot(host) == before, result.describe()
    assert not mounts_under(str(tmp_path))
    text = refusal(result, tmp_path)  # runc's own rule; nvct applies it under crun too
    if mode != "legacy" or runtime == "crun":
        assert "symlink" in text and path in text, result.describe()


def test_a_root_owned_by_another_user_is_refused(tmp_path, sim_node, rootfs):
    """The owner's own directory as root.path: no write into it (not owned as an engine owns a root)."""
    need_runtime("runc")
    os.chown(rootfs, OWNER, OWNER)
    before = snapshot(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command="dlopen-probe libcuda.so.1")
    assert snapshot(rootfs) == before, result.describe()
    text = refusal(result, tmp_path)
    assert f"container root {rootfs}: owned by uid {OWNER}" in text, result.describe()


#: Where nvct's hook chain runs as a real createContainer hook: the shim's jit-cdi and cdi mode
#: when prepare declines (an image without an ld cache: only ldconfig can make one), and an
#: engine that applied a CDI spec itself (no shim: the hook has only the OCI state).
CHAIN_PATHS = ("jit-cdi", "cdi", "cdi-hook")
#: Through a toolkit or the .deb: its runtime's two modes, and its ``nvct`` as a CDI spec's hook program.
_CHAINS = {install: [(path, runtime) for path in CHAIN_PATHS for runtime in ("runc", "crun")] for install in INSTALLS}


@pytest.mark.parametrize("install, path, runtime", _cases(_CHAINS))
def test_the_chain_hook_writes_only_into_the_root_verified_on_the_host(request, tmp_path, sim_node, rootfs, install,
                                                                       runtime, path):
    """The runtime lost the race: another directory is mounted over root.path's name in the container's
    mount namespace (crun mounts a swapped-in host directory there). Stood in for, every time, by a
    createContainer hook before nvct's that mounts a full host root over root.path: nvct's chain must
    refuse it, never write the ld cache or links there."""
    from tests.support.bundle import add_hook, edit_config, make_bundle
    from tests.support.gpu_runs import PATH_ENV
    from tests.support.runtimes import RUNTIMES, run_container

    need_runtime(runtime)
    toolkits = installs(request, install)
    os.unlink(os.path.join(rootfs, "etc/ld.so.cache"))  # the shim leaves the chain to the hook
    host = make_rootfs(tmp_path, name="host")
    before = snapshot(host)
    over = {"path": "/usr/bin/mount", "args": ["mount", "--bind", host, rootfs], "env": [PATH_ENV]}

    def edit(spec: dict) -> None:
        spec.setdefault("hooks", {}).setdefault("createContainer", []).insert(0, over)

    if path == "cdi-hook":
        bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh", "-c", "true"], env=[PATH_ENV])
        with edit_config(bundle) as spec:
            edit(spec)
        errors = tmp_path / "hook-stderr"  # crun shows no hook's stderr
        wrapper = tmp_path / "nvct-hook"
        wrapper.write_text(f'#!/bin/sh\nexec {hook_program(install, toolkits, runtime)} "$@" 2>>{errors}\n')
        wrapper.chmod(0o755)
        add_hook(bundle, "createContainer", str(wrapper), ["nvct", "hook", "chain", "create-symlinks", "--link",
                                                   "libc.so.6::/usr/lib/nvct-probe.so", "--", "update-ldcache",
                                                   "--folder", "/usr/lib"], env=[PATH_ENV])
        result = run_container([*enter(install, toolkits, runtime, bundle), *RUNTIMES[runtime]], bundle)
    else:
        result = starter(install, toolkits)(tmp_path, sim_node, rootfs, mode=path, runtime=runtime,
                                            env=["NVIDIA_VISIBLE_DEVICES=0"], command="dlopen-probe libcuda.so.1",
                                            edit=edit)
    assert not nvct_writes(before, snapshot(host), "jit-cdi"), result.describe()
    assert not mounts_left(str(tmp_path), install, toolkits, runtime)
    text = refusal(result, tmp_path if path != "cdi-hook" else None)
    if path == "cdi-hook":
        text = errors.read_text()
    if runtime == "runc" or path == "cdi-hook":  # crun shows no hook's stderr
        assert "another directory there than the one verified on the host" in text, result.describe()
