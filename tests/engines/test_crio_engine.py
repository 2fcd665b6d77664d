from __future__ import annotations

import os

import pytest

from nvct import engines as runtimes
from nvct.base.errors import ConfigError
from tests.engines import toml_loads

NVIDIA = "/usr/bin/nvidia-container-runtime"

CRIO_CONF = '''\
# The CRI-O configuration file.
[crio.runtime]
default_runtime = "crun"

[crio.runtime.runtimes.crun]
runtime_path = "/usr/bin/crun"
runtime_type = "oci"
runtime_root = "/run/crun"
monitor_path = "/usr/libexec/crio/conmon"
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
'''


def _layout(tmp_path):
    main = tmp_path / "crio.conf"
    main.write_text(CRIO_CONF)
    return main, tmp_path / "crio.conf.d" / "99-nvidia.toml"


def test_drop_in_holds_the_runtime_with_the_default_runtimes_monitor_settings(tmp_path):
    main, drop_in = _layout(tmp_path)
    runtimes.configure("crio", str(main), {"nvidia": NVIDIA}, set_default="nvidia")
    assert main.read_text() == CRIO_CONF
    assert toml_loads(drop_in.read_text()) == {"crio": {"runtime": {
        "runtimes": {"nvidia": {
            "runtime_path": NVIDIA, "runtime_type": "oci", "runtime_root": "/run/crun",
            "monitor_path": "/usr/libexec/crio/conmon", "monitor_cgroup": "pod",
            "monitor_env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}},
        "default_runtime": "nvidia"}}}


def test_drop_in_unconfigure_removes_it_and_leaves_nothing_in_crio_conf_d(tmp_path):
    main, drop_in = _layout(tmp_path)
    runtimes.configure("crio", str(main), {"nvidia": NVIDIA})
    assert os.listdir(drop_in.parent) == ["99-nvidia.toml"]  # no backup, no record: cri-o reads every file
    runtimes.unconfigure("crio", str(main))
    assert sorted(os.listdir(tmp_path)) == ["crio.conf"]


def test_existing_drop_in_is_restored_byte_for_byte(tmp_path):
    main, drop_in = _layout(tmp_path)
    drop_in.parent.mkdir()
    old = b'[crio.runtime.runtimes.nvidia]\nruntime_path = "/old/nvidia-container-runtime"\n'
    drop_in.write_bytes(old)
    runtimes.configure("crio", str(main), {"nvidia": NVIDIA})
    assert toml_loads(drop_in.read_text())["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_path"] == NVIDIA
    assert os.listdir(drop_in.parent) == ["99-nvidia.toml"]
    runtimes.unconfigure("crio", str(main))
    assert drop_in.read_bytes() == old


def test_plain_mode_edits_crio_conf_in_place(tmp_path):
    main, drop_in = _layout(tmp_path)
    runtimes.configure("crio", str(main), {"nvidia": NVIDIA}, drop_in=None, set_default="nvidia")
    text = main.read_text()
    assert text.startswith("# The CRI-O configuration file.\n")
    runtime = toml_loads(text)["crio"]["runtime"]
    assert runtime["default_runtime"] == "nvidia"
    assert runtime["runtimes"]["nvidia"]["runtime_path"] == NVIDIA
    assert not drop_in.exists()
    runtimes.unconfigure("crio", str(main))
    assert main.read_text() == CRIO_CONF


def test_no_runtime_to_copy_gives_just_path_and_type(tmp_path):
    main = tmp_path / "crio.conf"
    runtimes.configure("crio", str(main), {"nvidia": NVIDIA})
    assert toml_loads((tmp_path / "crio.conf.d" / "99-nvidia.toml").read_text()) == {
        "crio": {"runtime": {"runtimes": {"nvidia": {"runtime_path": NVIDIA, "runtime_type": "oci"}}}}}
    assert not main.exists()


def test_cdi_is_a_no_op_with_a_note(tmp_path):
    main, _ = _layout(tmp_path)
    change = runtimes.configure("crio", str(main), {"nvidia": NVIDIA}, cdi=True, dry_run=True)
    assert any("cri-o enables CDI by itself" in n for n in change.notes)


def test_config_inside_a_drop_in_directory_is_refused_in_plain_mode(tmp_path):
    conf_d = tmp_path / "crio.conf.d"
    conf_d.mkdir()
    config = conf_d / "10-crio.conf"
    config.write_text(CRIO_CONF)
    with pytest.raises(ConfigError, match="cri-o reads every file in its directory"):
        runtimes.configure("crio", str(config), {"nvidia": NVIDIA}, drop_in=None)
    assert os.listdir(conf_d) == ["10-crio.conf"]


def test_runtimes_that_is_not_a_table_is_an_error(tmp_path):
    main = tmp_path / "crio.conf"
    main.write_text('[crio.runtime]\nruntimes = "x"\n')
    with pytest.raises(ConfigError, match=r"crio.conf: crio.runtime.runtimes is not a table/object$"):
        runtimes.configure("crio", str(main), {"nvidia": NVIDIA})


def test_unconfigure_without_record_unsets_default_and_removes_drop_in(tmp_path):
    main, drop_in = _layout(tmp_path)
    drop_in.parent.mkdir()
    drop_in.write_text('[crio.runtime]\ndefault_runtime = "nvidia"\n'
                       '[crio.runtime.runtimes.nvidia]\nruntime_path = "/x"\n')
    runtimes.unconfigure("crio", str(main))
    assert not drop_in.exists()
    assert main.read_text() == CRIO_CONF
