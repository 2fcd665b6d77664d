"""Which fields and names each cdiVersion allows, and the minimum version of a spec."""

from __future__ import annotations

import copy

import pytest

from nvct.cdi import schema, spec, version
from nvct.cdi.schema import Invalid

from .conftest import minimal_spec


def _with_device_edits(**edits):
    return lambda s: s["devices"][0]["containerEdits"].update(edits)


def _set(path, value):
    def apply(s):
        target = s
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


#: feature -> (how to add it to a minimal spec, first version with it)
FEATURES = {
    "mount type": (_with_device_edits(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]),
                   "0.4.0"),
    "device node hostPath": (_with_device_edits(deviceNodes=[{"path": "/dev/x", "hostPath": "/h/dev/x"}]),
                             "0.5.0"),
    "device name with a leading digit": (_set(["devices", 0, "name"], "0"), "0.5.0"),
    "spec annotations": (_set(["annotations"], {"a": "b"}), "0.6.0"),
    "device annotations": (_set(["devices", 0, "annotations"], {"a": "b"}), "0.6.0"),
    "dot in the class": (_set(["kind"], "vendor.com/dev.ice"), "0.6.0"),
    "intelRdt": (_with_device_edits(intelRdt={"closID": "c1"}), "0.7.0"),
    "empty intelRdt": (_with_device_edits(intelRdt={}), "0.7.0"),
    "additionalGids": (_with_device_edits(additionalGids=[44]), "0.7.0"),
    "spec-level additionalGids": (_set(["containerEdits"], {"additionalGids": [44]}), "0.7.0"),
    "netDevices": (_with_device_edits(netDevices=[{"hostInterfaceName": "eth1", "name": "net0"}]), "1.1.0"),
    "intelRdt schemata": (_with_device_edits(intelRdt={"schemata": ["L3:0=ff"]}), "1.1.0"),
    "empty intelRdt schemata": (_with_device_edits(intelRdt={"schemata": []}), "1.1.0"),
    "intelRdt enableMonitoring": (_with_device_edits(intelRdt={"enableMonitoring": True}), "1.1.0"),
}

#: Zero values need no newer version (Go cannot tell them from absent fields): case -> minimum.
ZERO_VALUES = {
    "empty hostPath": (_with_device_edits(deviceNodes=[{"path": "/dev/x", "hostPath": ""}]), "0.3.0"),
    "empty mount type": (_with_device_edits(mounts=[{"hostPath": "/a", "containerPath": "/a", "type": ""}]),
                         "0.3.0"),
    "empty annotations": (_set(["annotations"], {}), "0.3.0"),
    "empty additionalGids": (_with_device_edits(additionalGids=[]), "0.3.0"),
    "null intelRdt": (_with_device_edits(intelRdt=None), "0.3.0"),
    "false enableMonitoring": (_with_device_edits(intelRdt={"enableMonitoring": False}), "0.7.0"),
}


def _spec_with(add, declared):
    s = minimal_spec(declared)
    add(s)
    return s


@pytest.mark.parametrize("declared", version.SUPPORTED)
def test_minimal_spec_is_valid_in_every_supported_version(declared):
    assert spec.validate(minimal_spec(declared)).version == declared


@pytest.mark.parametrize("declared", version.SUPPORTED)
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_feature_is_valid_exactly_from_its_version(feature, declared):
    add, since = FEATURES[feature]
    s = _spec_with(add, declared)
    if version.rank(declared) >= version.rank(since):
        spec.validate(s)
    else:
        with pytest.raises(Invalid, match=f"needs cdiVersion {since} or later, but the spec declares {declared}"):
            spec.validate(s)


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_minimum_version_is_the_version_that_added_the_feature(feature):
    add, since = FEATURES[feature]
    assert schema.minimum_version(_spec_with(add, "1.1.0")) == since


@pytest.mark.parametrize("case", sorted(ZERO_VALUES))
def test_zero_values_need_no_newer_version(case):
    add, minimum = ZERO_VALUES[case]
    s = _spec_with(add, minimum)
    assert schema.minimum_version(s) == minimum
    spec.validate(s)


@pytest.mark.parametrize("declared", version.SUPPORTED)
@pytest.mark.parametrize("field", ["enableCMT", "enableMBM"])
def test_rdt_cmt_and_mbm_exist_from_0_7_until_1_1(field, declared):
    s = _spec_with(_with_device_edits(intelRdt={field: True}), declared)
    if version.rank(declared) < version.rank("0.7.0"):
        with pytest.raises(Invalid, match="needs cdiVersion 0.7.0"):
            spec.validate(s)
    elif declared == "1.1.0":
        with pytest.raises(Invalid, match=f"intelRdt.{field}: unknown field in cdiVersion 1.1.0"):
            spec.validate(s)
    else:
        spec.validate(s)


def test_no_version_has_both_removed_and_new_rdt_fields():
    s = _spec_with(_with_device_edits(intelRdt={"enableCMT": True, "schemata": ["L3:0=f"]}), "1.1.0")
    with pytest.raises(Invalid, match="no cdiVersion has both"):
        schema.minimum_version(s)


def test_version_with_a_leading_v_is_accepted():
    assert spec.validate(minimal_spec("v0.6.0")).version == "0.6.0"


@pytest.mark.parametrize("declared, message", [
    ("0.2.0", "cdiVersion 0.2.0 is no longer supported"),
    ("0.1.0", "cdiVersion 0.1.0 is no longer supported"),
    ("2.0.0", "unknown cdiVersion '2.0.0'"),
    ("0.5", "unknown cdiVersion '0.5'"),
    (5, "unknown cdiVersion 5"),
    ("", "cdiVersion is missing"),
])
def test_unknown_and_retired_versions_are_rejected(declared, message):
    with pytest.raises(Invalid, match=message):
        spec.validate(minimal_spec(declared))


@pytest.mark.parametrize("mutate, message", [
    (_set(["devices", 0, "containerEdits", "foo"], 1), r"devices\[0\].containerEdits.foo: unknown field"),
    (_set(["extra"], 1), "extra: unknown field"),
    (_set(["devices", 0, "containerEdits", "deviceNodes"], [{"path": "/dev/x", "major": "1"}]),
     r"deviceNodes\[0\].major: expected a 64-bit integer, got str"),
    (_set(["devices", 0, "containerEdits", "deviceNodes"], [{"path": "/dev/x", "major": 1.0}]),
     "expected a 64-bit integer, got float"),
    (_set(["devices", 0, "containerEdits", "deviceNodes"], [{"path": "/dev/x", "uid": -1}]),
     "uid: expected an integer from 0 to 4294967295"),
    (_set(["devices", 0, "containerEdits", "deviceNodes"], [{"path": "/dev/x", "fileMode": True}]),
     "fileMode: expected an integer from 0 to 4294967295, got a boolean"),
    (_set(["devices", 0, "containerEdits", "env"], "A=1"), "env: expected a list"),
    (_set(["devices", 0, "containerEdits", "env"], [1]), r"env\[0\]: expected a string"),
    (_set(["devices", 0, "containerEdits", "hooks"], [None]), r"hooks\[0\]: expected a mapping, got null"),
    (_set(["devices"], {"name": "x"}), "devices: expected a list"),
    (_set(["kind"], ["a"]), "kind: expected a string"),
])
def test_fields_are_strict_and_typed(mutate, message):
    s = minimal_spec("0.5.0")
    mutate(s)
    with pytest.raises(Invalid, match=message):
        spec.validate(s)


def test_null_fields_are_absent_fields():
    s = minimal_spec("0.3.0")
    s["containerEdits"] = None
    s["devices"][0]["containerEdits"]["mounts"] = None
    spec.validate(s)


def test_minimum_version_ignores_the_declared_version():
    s = minimal_spec("1.1.0")
    assert schema.minimum_version(s) == "0.3.0"
    assert schema.minimum_version(copy.deepcopy(s) | {"cdiVersion": "bogus"}) == "0.3.0"
