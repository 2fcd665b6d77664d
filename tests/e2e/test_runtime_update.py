"""A legacy-mode GPU container keeps its GPU when its cgroup is applied again (issue 25, item 6).

``systemctl daemon-reload`` with the systemd cgroup driver makes systemd apply the container's
device cgroup again from the rules it was given: the spec's. The legacy hook grants the GPU
behind the runtime's back, so before, the reload took it away ("Failed to initialize NVML:
Unknown Error"). The shim now writes the requested devices into ``linux.resources.devices`` as
CDI modes do. The config is recorded as on a node, so the shim's sh front would take the create
if it still could (tests/e2e/test_legacy_front.py).

With the cgroupfs driver, ``runc update`` (runc 1.1, v1 and v2) and ``crun update`` (crun 1.8, v1)
leave device rules alone, so there the hook's grant survived before as well: those runs check the
GPU still opens and the rules are in the spec. cgroup v1 is this machine's; cgroup v2 is the bed
of tests/e2e/test_cgroup_v2.py (cgroup2 on /sys/fs/cgroup in a private mount namespace per runtime
call), where crun cannot run here. The systemd driver runs under a real systemd (PID 1 of a
container, tests/e2e/test_refresh_units.py), on v1 and in the v2 bed, where systemd compiles the
device programs (old code: every GPU node denied after the reload, on both).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.e2e.conftest import PATH_ENV, expected_nodes
from tests.e2e.test_cgroup_v2 import OPEN, V2_RUNC, _v2_ok
from tests.e2e.test_refresh_units import RUNC as OUTER_RUNC, SYSTEMD, SystemdContainer
from tests.packaging.pkgtest import REPO
from tests.support.bundle import edit_config, make_bundle, read_config
from tests.support.fixtures import need_binaries, need_root, skip
from tests.support.gpu_runs import need_runtime
from tests.support.legacy_front import gpu_front, shim_env
from tests.support.proc import run, short_tempdir, unique_id, wait_until
from tests.support.runtimes import RUNTIMES

pytestmark = pytest.mark.containers

VENV_PYTHON = sys.executable


def _wrapped(cgroup: str) -> list[str]:
    """The argv prefix that runs a runtime (or the front) on cgroup ``v1`` or ``v2``."""
    if cgroup == "v1":
        return []
    reason = _v2_ok()
    if reason:
        skip(reason)
    return V2_RUNC[:-1]


def _update(tmp_path, cgroup: str) -> list[str]:
    """``update``'s arguments: a memory limit; in the v2 bed, where the host's cgroup v1 holds every
    controller, an empty update (runc still applies the cgroup again)."""
    if cgroup == "v1":
        return ["--memory", "268435456"]
    resources = tmp_path / "resources.json"
    resources.write_text("{}")
    return ["--resources", str(resources)]


def _access(base: list[str], cid: str, nodes: list[str]) -> dict[str, str]:
    """``open``/``denied`` per node, from a process ``exec``'d into the container (its cgroup)."""
    proc = run([*base, "exec", cid, "sh", "-c", OPEN, "sh", *nodes], timeout=30)
    assert proc.ok, proc.describe()
    return dict(reversed(line.split(" ")[:2]) for line in proc.stdout.splitlines())


@pytest.mark.parametrize("runtime, cgroup", [("runc", "v1"), ("crun", "v1"), ("runc", "v2")])
def test_legacy_gpus_survive_a_runtime_update(tmp_path, sim_node, rootfs, runtime, cgroup):
    need_runtime(runtime)
    wrapper = _wrapped(cgroup)
    front, config = gpu_front(tmp_path, sim_node["config"], RUNTIMES[runtime][0], cgroups=True)
    injected = sorted(expected_nodes(sim_node, [1], [(0, 1)]))
    visible = f"1,{sim_node['gpus'][0]['mig_devices'][1]['uuid']}"
    probe = os.path.join(rootfs, "probe", "unrequested-gpu2")  # GPU 2: not requested, stays denied
    os.makedirs(os.path.dirname(probe), exist_ok=True)
    if not os.path.exists(probe):
        os.mknod(probe, 0o666 | 0o020000, os.makedev(195, sim_node["gpus"][2]["minor"]))
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sleep", "600"],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={visible}"])
    state = short_tempdir("nvct-upd-")
    cid = unique_id()
    low = [*wrapper, *RUNTIMES[runtime], "--root", state]
    err = tmp_path / "create.err"
    try:
        with open(err, "wb") as stderr:  # the container's init keeps what it inherits: no pipe
            proc = subprocess.run([*wrapper, front.shim, "--root", state, "create", "--bundle", str(bundle), cid],
                                  env=shim_env(config), cwd=bundle, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=stderr, timeout=60)
        assert proc.returncode == 0, err.read_text()
        run([*low, "start", cid], timeout=30).check()
        expected = {**{n: "open" for n in injected}, "/probe/unrequested-gpu2": "denied"}
        assert _access(low, cid, [*injected, "/probe/unrequested-gpu2"]) == expected
        run([*low, "update", *_update(tmp_path, cgroup), cid], timeout=30).check()
        assert _access(low, cid, [*injected, "/probe/unrequested-gpu2"]) == expected, (runtime, cgroup)
        rules = read_config(bundle)["linux"]["resources"]["devices"]
        assert {"allow": True, "type": "c", "major": 195, "minor": sim_node["gpus"][1]["minor"],
                "access": "rwm"} in rules, rules
    finally:
        run([*low, "delete", "--force", cid], timeout=30)
        shutil.rmtree(state, ignore_errors=True)


class _V2Box(SystemdContainer):
    """The box in the cgroup v2 bed: it starts, and every runc call on it runs, with cgroup2 on
    /sys/fs/cgroup (systemd inside then runs the unified hierarchy and compiles device programs)."""

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([*V2_RUNC[:-1], OUTER_RUNC, "--root", self.state, "exec", self.cid, *argv],
                              capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def close(self) -> None:
        subprocess.run([*V2_RUNC[:-1], OUTER_RUNC, "--root", self.state, "delete", "--force", self.cid],
                       capture_output=True, timeout=60, check=False)
        super().close()


@pytest.fixture(params=["v1", "v2"])
def systemd_box(request, tmp_path, tmp_path_factory):
    """systemd as PID 1 of a runc container (tests/e2e/test_refresh_units.py), on cgroup v1 or in the
    v2 bed, whose own devices cgroup allows everything, so that the runc it runs may give a container
    the GPU; the test's files (node, rootfs, bundle) and the checkout at their own paths inside."""
    need_root("runs systemd in a container")
    need_binaries(OUTER_RUNC, SYSTEMD, "/usr/bin/unshare")
    binds = [str(tmp_path_factory.getbasetemp()), str(REPO)]
    binds += [p for p in {os.path.realpath(os.path.dirname(os.path.dirname(VENV_PYTHON)))}
              if not p.startswith(str(REPO) + "/")]
    if request.param == "v2":
        reason = _v2_ok()
        if reason:
            skip(reason)
        box = _V2Box(str(tmp_path / "sd"), binds, prepare="mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    else:
        box = SystemdContainer(str(tmp_path / "sd"), binds, prepare=":")
    with edit_config(box.bundle) as spec:
        spec["linux"]["resources"]["devices"] = [{"allow": True, "access": "rwm"}]
        # The kernel's registry of char devices, where runc's systemd driver looks a rule's
        # major:minor up before it tells systemd (else "skipping device ... for systemd"):
        # the machine's and the simulated node's, filled in by the test.
        spec["mounts"].append({"destination": "/sys/dev/char", "type": "tmpfs", "source": "tmpfs",
                               "options": ["nosuid", "nodev", "noexec"]})
    try:
        box.start()
        assert wait_until(lambda: box.exec("systemctl", "is-system-running", check=False).stdout.strip()
                          in ("running", "degraded"), 60), box.exec("systemctl", "list-jobs", check=False).stdout
        box.cgroup = request.param
        yield box
    finally:
        box.close()


def test_legacy_gpus_survive_daemon_reload_with_the_systemd_driver(tmp_path, sim_node, rootfs, systemd_box):
    """runc's systemd cgroup driver: systemd holds the container's ``DeviceAllow=`` and applies it
    again on ``systemctl daemon-reload``, dropping any grant it was not told about (old code: every
    GPU node denied after the reload). A ``runc update`` after it keeps them too."""
    box = systemd_box
    front, config = gpu_front(tmp_path, sim_node["config"], RUNTIMES["runc"][0], cgroups=True)
    injected = sorted(expected_nodes(sim_node, [1], [(0, 1)]))
    visible = f"1,{sim_node['gpus'][0]['mig_devices'][1]['uuid']}"
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sleep", "600"],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={visible}"])
    cid = unique_id()
    dev = os.path.join(os.path.dirname(sim_node["config"]), "dev")
    registry = {f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" for st in
                (os.lstat(os.path.join(d, f)) for d, _, files in os.walk(dev) for f in files)
                if stat.S_ISCHR(st.st_mode)} | set(os.listdir("/sys/dev/char"))  # and the machine's own
    box.exec("sh", "-c", 'cd /sys/dev/char && touch "$@"', "sh", *sorted(registry))

    with edit_config(bundle) as spec:
        spec["linux"]["cgroupsPath"] = f"system.slice:nvct:{cid}"
    state = f"{tmp_path}/state"
    create = ["env", *(f"{k}={v}" for k, v in shim_env(config).items()), front.shim, "--root", state,
              "--systemd-cgroup", "create", "--bundle", str(bundle), cid]
    # The container's init keeps the streams it inherits: files, not exec's pipes.
    box.exec("sh", "-c", 'cd "$0" && "$@" </dev/null >/dev/null 2>"$0/create.err" || { cat "$0/create.err"; '
                         'exit 1; }', str(bundle), *create)
    low = [RUNTIMES["runc"][0], "--root", state, "--systemd-cgroup"]
    try:
        box.exec(*low, "start", cid)
        expected = {n: "open" for n in injected}

        def access() -> dict[str, str]:
            out = box.exec(*low, "exec", cid, "sh", "-c", OPEN, "sh", *injected).stdout
            return dict(reversed(line.split(" ")[:2]) for line in out.splitlines())

        assert access() == expected
        if box.cgroup == "v2":  # runc really ran in unified mode, under systemd's device program
            assert box.exec(*low, "exec", cid, "grep", "-c", "^0::/", "/proc/self/cgroup").stdout.strip() == "1"
        box.exec("systemctl", "daemon-reload")
        unit = box.exec("systemctl", "show", f"nvct-{cid}.scope", "-p", "DeviceAllow").stdout
        assert access() == expected, ("after daemon-reload", unit)
        box.exec(*low, "update", *_update(tmp_path, box.cgroup), cid)
        assert access() == expected, "after runc update"
    finally:
        box.exec(*low, "delete", "--force", cid, check=False)
