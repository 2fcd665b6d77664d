"""Legacy-mode realization details that containers on this machine cannot show.

No container here has a /proc/driver/nvidia of its own (the simulated node's
procfs is plain files), so the masking is checked on a rootfs whose
/proc/driver/nvidia is a directory, in a private mount namespace.
"""

import os
import subprocess

import pytest

from nvct.config import file as config_mod
from nvct.discover.driver import Driver
from nvct.linux.namespaces import in_private_mount_namespace
from nvct.modifier import legacy as realize
from nvct.rootfs.root import Rootfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts in a private namespace)")


def _mask_and_list(rootfs, driver, visible):
    # Only the kernel's /proc/driver/nvidia is masked: this process's own, bound from the test's tree.
    subprocess.run(["mount", "--bind", os.path.join(rootfs, "proc/driver"), "/proc/driver"], check=True)
    with Rootfs(rootfs) as root:
        realize._mask_procfs(root, driver, (visible, []))
    gpus = os.path.join(rootfs, "proc/driver/nvidia/gpus")
    listing = sorted(os.listdir(gpus))
    info = {bus: open(os.path.join(gpus, bus, "information")).read() for bus in listing}
    try:
        open(os.path.join(gpus, "new"), "w").close()
        writable = True
    except OSError:
        writable = False
    return listing, info, writable


def test_proc_driver_nvidia_shows_only_visible_gpus(tmp_path, sim_node):
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    rootfs = tmp_path / "rootfs"
    for gpu in driver.gpus:  # what the container's procfs would show: every GPU
        (rootfs / "proc/driver/nvidia/gpus" / gpu.bus_id).mkdir(parents=True)
    visible = [driver.gpus[1], driver.gpus[3]]
    listing, info, writable = in_private_mount_namespace(_mask_and_list, str(rootfs), driver, visible)
    assert listing == [driver.gpus[1].bus_id, driver.gpus[3].bus_id]
    assert f"GPU UUID: \t {driver.gpus[3].uuid}" in info[driver.gpus[3].bus_id]
    assert not writable
    # Nothing leaked into this namespace.
    assert len(os.listdir(rootfs / "proc/driver/nvidia/gpus")) == len(driver.gpus)


def test_container_without_proc_driver_nvidia_is_left_alone(tmp_path, sim_node):
    driver = Driver.from_config(config_mod.load(sim_node["config"]))
    (tmp_path / "rootfs/proc").mkdir(parents=True)

    def run():
        with Rootfs(str(tmp_path / "rootfs")) as root:
            realize._mask_procfs(root, driver, (list(driver.gpus), []))
        return os.listdir(tmp_path / "rootfs/proc")

    assert in_private_mount_namespace(run) == []
