"""The nvidia-cdi-refresh units under a real systemd: a driver upgrade regenerates the spec, every time.

systemd is not PID 1 on the test machine, so it runs as PID 1 of a runc
container: the root is an overlay of the machine's own ``/`` (Debian 12's
systemd, this checkout's virtualenv) with a tmpfs on top, so nothing of the
host is written; its own cgroup namespace, ``/run`` and ``/tmp``; ``/sys``
read-only, so no udev runs. It boots to ``basic.target``; the packaged units
go to ``/etc/systemd/system``, ``/usr/bin/nvidia-ctk`` is the checkout's,
and the env file points ``nvidia-ctk`` at a simulated node, bind-mounted so
that the test can re-simulate it (a driver "upgrade") from outside.
An upgrade is what a driver package does: new files, then ``depmod``
rewriting ``modules.dep``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.e2e.conftest import VENV_BIN
from tests.packaging.pkgtest import REPO
from tests.support.bundle import edit_config, host_capabilities, make_bundle
from tests.support.fixtures import need_binaries, need_root
from tests.support.proc import short_tempdir, unique_id, wait_until
from tests.support.runtimes import RUNC

pytestmark = pytest.mark.containers

SYSTEMD = "/lib/systemd/systemd"
UNITS = REPO / "packaging" / "systemd"
KERNEL = os.uname().release
MODULES_DEP = f"/lib/modules/{KERNEL}/modules.dep"
#: What depmod writes when a driver package installs nvidia.ko (dkms's layout).
NVIDIA_DEP = "updates/dkms/nvidia.ko.xz:\nupdates/dkms/nvidia-uvm.ko.xz: updates/dkms/nvidia.ko.xz\n"


class SystemdContainer:
    """systemd as PID 1 of a runc container whose root is an overlay of ``/`` (see the module doc)."""

    def __init__(self, workdir: str, binds: list[str], prepare: str) -> None:
        """``binds``: host paths seen at the same path inside; ``prepare``: sh run on the new root ($ROOT)."""
        self.prepare = prepare
        self.state = short_tempdir("nvct-sd-")
        self.cid = unique_id("nvct-sd")
        self.bundle = os.path.join(workdir, "bundle")
        self.merged = os.path.join(self.bundle, "rootfs")
        self.layer = os.path.join(workdir, "layer")
        os.makedirs(self.merged)
        os.makedirs(self.layer)
        mounts = [{"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=755"]},
                  {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
                  *({"destination": p, "type": "bind", "source": p, "options": ["rbind", "rw"]} for p in binds)]
        make_bundle(self.bundle, self.merged, [SYSTEMD, "--unit=basic.target"], ["container=oci"],
                    caps=host_capabilities(), mounts=mounts)
        with edit_config(self.bundle) as spec:
            spec["process"]["noNewPrivileges"] = False
            spec["linux"]["namespaces"].append({"type": "cgroup"})
            for m in spec["mounts"]:
                if m["destination"] == "/sys/fs/cgroup":
                    m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]
        self.log = open(os.path.join(workdir, "console.log"), "wb")

    def start(self) -> None:
        # The overlay lives in a private mount namespace that only the container keeps: it goes with it.
        # An empty fstab: the host's mounts are none of this systemd's business.
        setup = (f"set -e; mount -t tmpfs tmpfs {self.layer}; mkdir {self.layer}/u {self.layer}/w; "
                 f"mount -t overlay overlay -o lowerdir=/,upperdir={self.layer}/u,workdir={self.layer}/w "
                 f"{self.merged}; ROOT={self.merged}; : > $ROOT/etc/fstab; {self.prepare}; "
                 f"exec {RUNC} --root {self.state} run --detach --bundle {self.bundle} {self.cid}")
        subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup],
                       stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, check=True, timeout=60)

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([RUNC, "--root", self.state, "exec", self.cid, *argv],
                              capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode != 0:
            journal = subprocess.run([RUNC, "--root", self.state, "exec", self.cid, "journalctl", "--no-pager",
                                      "-n", "40", "-u", "nvidia-cdi-refresh.service"],
                                     capture_output=True, text=True, timeout=60, check=False).stdout
            raise AssertionError(f"{argv}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}\n{journal}")
        return proc

    def systemctl_show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.exec("systemctl", "show", unit, *(f"-p{p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def close(self) -> None:
        subprocess.run([RUNC, "--root", self.state, "delete", "--force", self.cid],
                       capture_output=True, timeout=60, check=False)
        self.log.close()
        shutil.rmtree(self.state, ignore_errors=True)


def _simulate(node_dir: str, version: str, *, mig: bool = True) -> None:
    subprocess.run([os.path.join(VENV_BIN, "nvct"), "simulate", "node", "--driver-version", version,
                    "--mig" if mig else "--no-mig", node_dir], check=True, capture_output=True, timeout=120)


def _device_names(path: str) -> set[str]:
    try:
        with open(path) as f:
            return {d["name"] for d in yaml.safe_load(f)["devices"]}
    except FileNotFoundError:
        return set()


def _spec_version(path: str) -> str | None:
    """The driver version the spec's libcuda mount names (None while there is no spec)."""
    try:
        with open(path) as f:
            spec = yaml.safe_load(f)
    except FileNotFoundError:
        return None
    for m in spec["containerEdits"].get("mounts", []):
        name = os.path.basename(m["containerPath"])
        if name.startswith("libcuda.so.") and name.count(".") > 2:
            return name[len("libcuda.so."):]
    return None


def _depmod(box: SystemdContainer) -> None:
    """What depmod does: each index written to NAME.tmp and renamed over NAME (modules.dep, then its .bin)."""
    steps = [f"mkdir -p {os.path.dirname(MODULES_DEP)}"]
    for name, text in ((MODULES_DEP, NVIDIA_DEP), (MODULES_DEP + ".bin", "index")):
        steps.append(f"printf '{text}' > {name}.tmp && mv {name}.tmp {name}")
    box.exec("sh", "-c", " && ".join(steps))


@pytest.fixture
def systemd_node(tmp_path):
    need_root("runs systemd in a container")
    need_binaries(RUNC, SYSTEMD, "/usr/bin/unshare")
    shared = tmp_path / "shared"  # the node and the spec, seen by the test and the container
    node_dir = shared / "node"
    shared.mkdir()
    _simulate(str(node_dir), "550.54.15")
    spec = shared / "nvidia.yaml"
    env_file = (f"NVIDIA_CTK_CDI_OUTPUT_FILE_PATH={spec}\n"
                f"NVIDIA_CTK_CONFIG_FILE_PATH={node_dir}/nvct-config.toml\n")
    # The checkout and its interpreter at their own paths: the container's /tmp is a tmpfs of its own,
    # and a clone may live under /tmp (the link to nvidia-ctk below must resolve inside).
    binds = [str(shared), str(REPO)] + [p for p in {os.path.realpath(os.path.dirname(VENV_BIN))}
                                       if not p.startswith(str(REPO) + "/")]
    box = SystemdContainer(str(tmp_path / "sd"), binds, prepare=(
        f"cp -r {UNITS}/. $ROOT/etc/systemd/system/; "
        f"ln -sf {VENV_BIN}/nvidia-ctk $ROOT/usr/bin/nvidia-ctk; "
        "printf '#!/bin/sh\\n' > $ROOT/usr/bin/nvidia-smi; chmod 755 $ROOT/usr/bin/nvidia-smi; "
        "mkdir -p $ROOT/etc/nvidia-container-toolkit; "
        f"printf '{env_file}' > $ROOT/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"))
    try:
        box.start()
        assert wait_until(lambda: box.exec("systemctl", "is-system-running", check=False).stdout.strip()
                          in ("running", "degraded"), 60), box.exec("systemctl", "list-jobs", check=False).stdout
        _depmod(box)  # the driver's package installed nvidia.ko
        yield box, str(node_dir), str(spec)
    finally:
        box.close()


def test_a_driver_upgrade_regenerates_the_spec_every_time(systemd_node):
    box, node_dir, spec = systemd_node
    # What the package's postinst does: enable --now both units.
    box.exec("systemctl", "enable", "--now", "nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
    assert wait_until(lambda: _spec_version(spec) == "550.54.15", 60), box.exec(
        "journalctl", "-u", "nvidia-cdi-refresh.service", "--no-pager", check=False).stdout
    for version in ("570.124.06", "535.161.08"):  # twice in a row: the path unit fires again
        _simulate(node_dir, version)
        _depmod(box)
        assert wait_until(lambda version=version: _spec_version(spec) == version, 60), box.exec(
            "journalctl", "-u", "nvidia-cdi-refresh.service", "--no-pager", check=False).stdout
    assert box.systemctl_show("nvidia-cdi-refresh.path", "ActiveState")["ActiveState"] == "active"
    # The env file's output path won over the unit's Environment=.
    assert box.exec("test", "-e", "/var/run/cdi/nvidia.yaml", check=False).returncode == 1
    state = box.systemctl_show("nvidia-cdi-refresh.service", "ActiveState", "Result")
    assert state == {"ActiveState": "inactive", "Result": "success"}  # not held "active (exited)"


def test_the_unit_orders_before_the_engines_and_not_after_multi_user(systemd_node):
    box, _, _ = systemd_node
    props = box.systemctl_show("nvidia-cdi-refresh.service", "Before", "After", "Restart",
                               "StartLimitBurst", "TimeoutStartUSec", "RemainAfterExit")
    assert {"docker.service", "containerd.service", "crio.service"} <= set(props["Before"].split())
    assert "multi-user.target" not in props["After"].split()
    assert props["Restart"] == "on-failure" and props["RemainAfterExit"] == "no"
    assert props["StartLimitBurst"] == "5" and props["TimeoutStartUSec"] == "1min 30s"


def test_a_failed_generation_is_retried(systemd_node):
    """A driver still settling fails generate: Restart=on-failure tries again (StartLimitBurst bounds it)."""
    box, node_dir, spec = systemd_node
    os.rename(os.path.join(node_dir, "nvct-config.toml"), os.path.join(node_dir, "away.toml"))
    box.exec("systemctl", "start", "--no-block", "nvidia-cdi-refresh.service")
    assert wait_until(lambda: box.systemctl_show("nvidia-cdi-refresh.service", "NRestarts")["NRestarts"] != "0",
                      30)
    os.rename(os.path.join(node_dir, "away.toml"), os.path.join(node_dir, "nvct-config.toml"))
    assert wait_until(lambda: _spec_version(spec) == "550.54.15", 60)  # the retry succeeded


def test_a_mig_reconfiguration_regenerates_the_spec(systemd_node):
    """Creating MIG instances makes nvidia-modprobe create their access nodes in /dev/nvidia-caps."""
    box, node_dir, spec = systemd_node
    _simulate(node_dir, "550.54.15", mig=False)
    box.exec("mkdir", "/dev/nvidia-caps")  # the driver's MIG config and monitor nodes live there
    box.exec("systemctl", "enable", "--now", "nvidia-cdi-refresh.path", "nvidia-cdi-refresh.service")
    assert wait_until(lambda: "0" in _device_names(spec), 60)
    assert "0:0" not in _device_names(spec)
    _simulate(node_dir, "550.54.15", mig=True)  # nvidia-smi mig -cgi ... -C
    box.exec("sh", "-c", "mknod -m 444 /dev/nvidia-caps/nvidia-cap12 c 237 12")
    assert wait_until(lambda: {"0:0", "0:1"} <= _device_names(spec), 60), box.exec(
        "journalctl", "-u", "nvidia-cdi-refresh.service", "--no-pager", check=False).stdout
