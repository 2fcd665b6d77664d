"""Wall-clock bounds of the rootfs layer: ldconfig's sandbox ends what would hang a container start."""

from __future__ import annotations

import os
import time

import pytest

from nvct.base.errors import ContainerError
from nvct.rootfs.ldconfig import update_ldcache
from tests.rootfs.test_ldconf import HANGING_CONFS, refuse_conf
from tests.rootfs.test_ldconfig import built, image  # noqa: F401 (fixtures)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, namespaces)")
def test_a_hanging_ldconfig_is_killed_within_seconds(image, built):
    start = time.monotonic()
    with pytest.raises(ContainerError, match="killed after 0.5s"):
        update_ldcache(str(image), [], ldconfig=f"@{built['sleeper']}", timeout=0.5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("files, line", HANGING_CONFS)
def test_conf_check_refuses_what_would_hang_ldconfig_within_a_second(tmp_path, files, line):
    start = time.monotonic()
    refuse_conf(tmp_path, files, line)
    assert time.monotonic() - start < 1
