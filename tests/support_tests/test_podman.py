from __future__ import annotations

import os

import pytest

from tests.support.fixtures import BUSYBOX_IMAGE
from tests.support.podman import cdi_spec, default_ulimits, unique_cdi_vendor

pytestmark = pytest.mark.containers


def test_podman_runs_echo(private_podman):
    result = private_podman.run(["--rm", BUSYBOX_IMAGE, "echo", "hi"])
    assert (result.rc, result.stdout) == (0, "hi\n"), result.describe()


def test_podman_runs_with_runc_too(private_podman):
    result = private_podman.run(["--rm", "--runtime", "runc", BUSYBOX_IMAGE,
                                 "sh", "-c", "ulimit -n"])
    assert result.ok, result.describe()
    assert result.stdout == default_ulimits()[0].split(":")[-1] + "\n"


def test_cleanup_removes_every_container(private_podman):
    assert private_podman.run(["-d", BUSYBOX_IMAGE, "sleep", "600"]).ok
    private_podman.cleanup()
    assert private_podman.podman(["ps", "-aq"]).stdout == ""


def test_cdi_spec_is_used_then_removed(private_podman):
    vendor = unique_cdi_vendor()
    spec = {"cdiVersion": "0.5.0", "kind": f"{vendor}/gpu",
            "devices": [{"name": "0", "containerEdits": {"env": ["NVCT_CDI=yes"]}}],
            "containerEdits": {}}
    with cdi_spec(spec) as path:
        assert path.startswith("/etc/cdi/") and os.path.isfile(path)
        result = private_podman.run(["--rm", "--device", f"{vendor}/gpu=0", BUSYBOX_IMAGE,
                                     "sh", "-c", "echo $NVCT_CDI"])
        assert (result.rc, result.stdout) == (0, "yes\n"), result.describe()
    assert not os.path.exists(path)


def test_cdi_spec_yaml_and_removal_on_error(tmp_path):
    directory = tmp_path / "cdi"
    with pytest.raises(RuntimeError):
        with cdi_spec({"cdiVersion": "0.5.0"}, directory=str(directory), name="x",
                      suffix=".yaml") as path:
            assert open(path).read() == "cdiVersion: 0.5.0\n"
            raise RuntimeError("test failed")
    assert not directory.exists()
