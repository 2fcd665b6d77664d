"""Purging the package while a container runs on its runtime: the container can still be stopped.

A private containerd runs a container through ``/usr/bin/nvidia-container-runtime``
(``ctr run --runc-binary``, as containerd records it for every container of the ``nvidia``
runtime); ``apt-get purge nvct`` removes that program; ``ctr task kill`` and ``ctr task rm``
still work (a stand-in took its place), and the stand-in goes with the container.
"""

from __future__ import annotations

import os

import pytest

from tests.packaging.test_deb import (
    _apt,
    _installed,
    _skip_if_this_machine_has_nvct_or_the_toolkit,
    deb,  # noqa: F401 - the built package, a fixture
    needs_root_and_apt,
)
from tests.support.containerd import CONTAINERD, CTR, RUNC, Containerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, need_binaries
from tests.support.proc import wait_for

pytestmark = pytest.mark.containers

RUNTIME = "/usr/bin/nvidia-container-runtime"


@needs_root_and_apt
def test_a_container_on_the_packaged_runtime_outlives_the_purge(deb, busybox_image_tar):
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    need_binaries(CONTAINERD, CTR, RUNC)
    with _installed(deb), Containerd() as containerd:
        containerd.import_image(busybox_image_tar)
        cid = "outlives-the-purge"
        containerd.ctr(["run", "-d", "--runc-binary", RUNTIME, BUSYBOX_IMAGE_QUALIFIED, cid,
                        "sleep", "3600"]).check()
        purge = _apt("purge", "nvct")
        assert purge.ok, purge.describe()
        assert "nvct: /usr/bin/nvidia-container-runtime: a stand-in takes its place for the containers still " \
               "running on it" in purge.stdout, purge.describe()
        containerd.ctr(["task", "kill", "-s", "KILL", cid]).check()
        wait_for(lambda: "STOPPED" in next((ln for ln in containerd.ctr(["task", "ls"]).check().stdout.splitlines()
                                            if ln.startswith(cid)), ""),
                 f"task {cid} stopped", detail=lambda: containerd.ctr(["task", "ls"]).stdout)
        containerd.ctr(["task", "rm", cid]).check()
        containerd.ctr(["container", "rm", cid]).check()
        assert not os.path.lexists(RUNTIME) and not os.path.lexists("/run/nvct-standins")
        assert _apt("install", "--no-install-recommends", str(deb.path)).ok  # for _installed's purge


@needs_root_and_apt
def test_purge_leaves_no_backup_of_nvct_config_in_place(deb):
    """``nvct config -i`` keeps ``config.toml.nvct.bak``; the purge takes it with the config."""
    from tests.packaging.test_deb import APT_ENV, CONFFILE
    from tests.support.proc import run

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    with _installed(deb):
        run(["/usr/bin/nvct", "config", "-i", "--set", "nvidia-container-cli.debug=/var/log/x.log"],
            env=APT_ENV).check()
        assert os.path.exists(CONFFILE + ".nvct.bak")
    # _installed's purge checked that nothing of the package's is left, the directory included
    assert not os.path.lexists(CONFFILE + ".nvct.bak")
