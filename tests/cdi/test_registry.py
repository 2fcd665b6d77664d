"""Spec directories: priorities, conflicts, invalid files, and resolving names to edits."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import RequestError, SpecError
from nvct.cdi.registry import Registry, container_edits
from nvct.edits.model import DeviceNode

from .conftest import minimal_spec, write_spec


def _spec(kind="vendor.com/dev", **devices):
    """A spec with devices name -> env value, and a spec-level env var."""
    return {"cdiVersion": "0.5.0", "kind": kind,
            "devices": [{"name": n, "containerEdits": {"env": [f"DEV={v}"]}} for n, v in devices.items()],
            "containerEdits": {"env": [f"SPEC={kind}"]}}


def test_devices_are_listed_by_qualified_name(tmp_path):
    write_spec(tmp_path / "a", "x.yaml", _spec(d1="1", d0="0"))
    write_spec(tmp_path / "a", "y.json", _spec("other.org/thing", t="t"))
    assert Registry([tmp_path / "a"]).device_names() == \
        ["other.org/thing=t", "vendor.com/dev=d0", "vendor.com/dev=d1"]


def test_a_later_directory_overrides_an_earlier_one(tmp_path):
    write_spec(tmp_path / "etc", "x.yaml", _spec(d0="etc", d1="etc"))
    write_spec(tmp_path / "run", "z.yaml", _spec(d0="run"))
    registry = Registry([tmp_path / "etc", tmp_path / "run"])
    assert registry.resolve(["vendor.com/dev=d0"]).env == ["SPEC=vendor.com/dev", "DEV=run"]
    assert registry.resolve(["vendor.com/dev=d1"]).env == ["SPEC=vendor.com/dev", "DEV=etc"]
    assert registry.problems() == []


def test_two_files_of_one_directory_defining_a_device_conflict(tmp_path):
    a = write_spec(tmp_path, "a.yaml", _spec(shared="a", only_a="a"))
    b = write_spec(tmp_path, "b.yaml", _spec(shared="b"))
    registry = Registry([tmp_path])
    assert registry.device_names() == ["vendor.com/dev=only_a"]
    assert registry.resolve(["vendor.com/dev=only_a"]).env == ["SPEC=vendor.com/dev", "DEV=a"]
    conflict = f"conflicting definitions of vendor.com/dev=shared in {a} and {b}"
    assert registry.problems() == [f"{a}: {conflict}", f"{b}: {conflict}"]
    with pytest.raises(RequestError, match=f"vendor.com/dev=shared is defined in both {a} and {b}"):
        registry.resolve(["vendor.com/dev=shared"])


def test_a_conflict_in_a_later_directory_drops_the_device_entirely(tmp_path):
    write_spec(tmp_path / "etc", "x.yaml", _spec(d0="etc"))
    write_spec(tmp_path / "run", "a.yaml", _spec(d0="a"))
    write_spec(tmp_path / "run", "b.yaml", _spec(d0="b"))
    assert Registry([tmp_path / "etc", tmp_path / "run"]).device_names() == []


def test_an_invalid_file_is_reported_and_never_hides_valid_ones(tmp_path):
    write_spec(tmp_path, "a-bad.yaml", "cdiVersion: 0.5.0\nkind: [\n")
    write_spec(tmp_path, "b-bad.json", minimal_spec("0.4.0", name="0"))
    write_spec(tmp_path, "c-good.yaml", _spec(d0="0"))
    registry = Registry([tmp_path])
    assert registry.device_names() == ["vendor.com/dev=d0"]
    assert registry.resolve(["vendor.com/dev=d0"]).env == ["SPEC=vendor.com/dev", "DEV=0"]
    problems = registry.problems()
    assert len(problems) == 2
    assert problems[0].startswith(f"{tmp_path}/a-bad.yaml: invalid YAML")
    assert problems[1] == (f"{tmp_path}/b-bad.json: devices[0].name '0' (a leading digit) needs "
                           "cdiVersion 0.5.0 or later, but the spec declares 0.4.0")


def test_only_yaml_and_json_files_are_read(tmp_path):
    write_spec(tmp_path, "a.yml", _spec(yml="1"))
    write_spec(tmp_path, "b.txt", _spec(txt="1"))
    write_spec(tmp_path / "sub.yaml", "c.yaml", _spec(sub="1"))
    write_spec(tmp_path, "d.json", _spec(json="1"))
    registry = Registry([tmp_path])
    assert registry.device_names() == ["vendor.com/dev=json"]
    assert registry.problems() == []


def test_a_fifo_in_a_spec_directory_is_reported_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "pipe.yaml")
    write_spec(tmp_path, "ok.yaml", _spec(d0="0"))
    registry = Registry([tmp_path])
    assert registry.device_names() == ["vendor.com/dev=d0"]
    assert registry.problems() == [f"{tmp_path}/pipe.yaml: not a regular file"]


def test_spec_edits_come_once_before_the_devices_edits(tmp_path):
    write_spec(tmp_path, "a.yaml", _spec(d0="0", d1="1"))
    write_spec(tmp_path, "b.yaml", _spec("other.org/x", x="x"))
    edits = Registry([tmp_path]).resolve(
        ["vendor.com/dev=d1", "other.org/x=x", "vendor.com/dev=d0", "vendor.com/dev=d1"])
    assert edits.env == ["SPEC=vendor.com/dev", "DEV=1", "SPEC=other.org/x", "DEV=x", "DEV=0"]


def test_unresolvable_names_make_one_error_saying_where_and_what(tmp_path):
    write_spec(tmp_path / "etc", "a.yaml", _spec(**{f"d{i}": str(i) for i in range(10)}))
    write_spec(tmp_path / "etc", "b.yaml", _spec("other.org/x", x="x"))
    write_spec(tmp_path / "etc", "broken.yaml", "{")
    registry = Registry([tmp_path / "etc", tmp_path / "run"])
    with pytest.raises(RequestError) as info:
        registry.resolve(["vendor.com/dev=d0", "vendor.com/dev=nope", "acme.com/gpu=0"])
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"unresolvable CDI devices vendor.com/dev=nope, acme.com/gpu=0; "
        f"looked in {tmp_path}/etc, {tmp_path}/run (missing); "
        f"found other.org/x: x; vendor.com/dev: d0, d1, d2, d3, d4, d5, d6, d7, and 2 more; "
        f"skipped {tmp_path}/etc/broken.yaml (invalid JSON: Expecting property name enclosed in double "
        f"quotes: line 1 column 2 (char 1))")


def test_a_long_request_is_listed_briefly(tmp_path):
    with pytest.raises(RequestError, match=r"^unresolvable CDI devices a.com/b=0, .*a.com/b=7, and 92 more; "):
        Registry([tmp_path]).resolve([f"a.com/b={i}" for i in range(100)])


def test_no_spec_at_all(tmp_path):
    with pytest.raises(RequestError, match=r"looked in .*/none \(missing\); found no devices$"):
        Registry([tmp_path / "none"]).resolve(["nvidia.com/gpu=0"])


def test_a_malformed_request_is_an_error(tmp_path):
    with pytest.raises(RequestError, match="invalid CDI device name 'nvidia.com/gpu=0 1': invalid character ' '"):
        Registry([tmp_path]).resolve(["nvidia.com/gpu=0 1"])


def test_an_unreadable_directory_is_reported_and_the_others_read(tmp_path):
    (tmp_path / "file").write_text("not a dir")
    write_spec(tmp_path / "ok", "a.yaml", _spec(d0="0"))
    registry = Registry([tmp_path / "file", tmp_path / "ok"])
    assert registry.device_names() == ["vendor.com/dev=d0"]
    assert registry.problems() == [f"{tmp_path}/file: cannot read CDI spec directory: Not a directory"]


# --- edits as injected ---

def test_device_nodes_without_type_or_major_are_completed_from_the_host():
    edits = container_edits({"deviceNodes": [{"path": "/dev/fake-null", "hostPath": "/dev/null"}]})
    st = os.stat("/dev/null")
    assert edits.device_nodes == [DeviceNode("/dev/fake-null", os.major(st.st_rdev), os.minor(st.st_rdev),
                                             "c", host_path="/dev/null", file_mode=st.st_mode & 0o7777)]


def test_a_fully_specified_node_needs_no_host_device():
    edits = container_edits({"deviceNodes": [{"path": "/dev/gone", "type": "c", "major": 195, "minor": 7}]})
    assert edits.device_nodes == [DeviceNode("/dev/gone", 195, 7, "c")]


def test_a_missing_host_device_is_an_error_naming_it():
    with pytest.raises(SpecError, match="s.yaml: device /dev/gone: cannot use host device /dev/gone: No such file"):
        container_edits({"deviceNodes": [{"path": "/dev/gone"}]}, "s.yaml")


def test_a_node_type_that_contradicts_the_host_is_an_error():
    with pytest.raises(SpecError, match=r"type 'b' does not match host device /dev/null \(type 'c'\)"):
        container_edits({"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/null", "type": "b"}]})


def test_a_regular_file_is_not_a_device(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(SpecError, match="not a device node"):
        container_edits({"deviceNodes": [{"path": "/dev/x", "hostPath": str(tmp_path / "f")}]})


def test_gid_zero_is_dropped_and_mounts_at_one_path_keep_the_last(tmp_path):
    write_spec(tmp_path, "a.yaml", {
        "cdiVersion": "0.7.0", "kind": "vendor.com/dev",
        "containerEdits": {"mounts": [{"hostPath": "/spec", "containerPath": "/data"}]},
        "devices": [{"name": "d", "containerEdits": {
            "additionalGids": [0, 44], "mounts": [{"hostPath": "/dev-level", "containerPath": "/data/"}]}}]})
    edits = Registry([tmp_path]).resolve(["vendor.com/dev=d"])
    assert edits.additional_gids == [44]
    assert [m.host_path for m in edits.mounts] == ["/dev-level"]


def test_rdt_and_net_devices_come_through(tmp_path):
    write_spec(tmp_path, "a.yaml", minimal_spec(
        "1.1.0", intelRdt={"closID": "gold", "schemata": ["L3:0=ff"], "enableMonitoring": True},
        netDevices=[{"hostInterfaceName": "eth1", "name": "gpu-net"}]))
    edits = Registry([tmp_path]).resolve(["vendor.com/device=dev0"])
    assert edits.intel_rdt.to_cdi() == {"closID": "gold", "schemata": ["L3:0=ff"], "enableMonitoring": True}
    assert [n.to_cdi() for n in edits.net_devices] == [{"hostInterfaceName": "eth1", "name": "gpu-net"}]
