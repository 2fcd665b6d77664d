"""Reading, validating and writing one spec file."""

from __future__ import annotations

import os
import stat

import pytest

from nvct.base.errors import SpecError
from nvct.cdi import spec
from nvct.cdi.schema import Invalid

from .conftest import minimal_spec, write_spec


def test_read_gives_kind_devices_and_version(tmp_path):
    path = write_spec(tmp_path, "a.yaml", minimal_spec("0.6.0", "acme.io/fpga.big", "x"))
    s = spec.read(path)
    assert (s.vendor, s.cls, s.kind, s.version) == ("acme.io", "fpga.big", "acme.io/fpga.big", "0.6.0")
    assert list(s.devices) == ["x"]
    assert s.qualified("x") == "acme.io/fpga.big=x"


@pytest.mark.parametrize("kind, reason", [
    ("vendor.com", "is not of the form vendor/class"),
    ("/device", "is not of the form vendor/class"),
    ("vendor.com/", "is not of the form vendor/class"),
    ("1vendor.com/device", "vendor '1vendor.com' must start with a letter"),
    ("vendor.com-/device", "vendor 'vendor.com-' must end with a letter or digit"),
    ("vendor.com/dev/ice", "invalid character '/' in class"),
    ("ven dor.com/device", "invalid character ' ' in vendor"),
    ("vendör.com/device", "invalid character 'ö' in vendor"),
])
def test_invalid_kinds(kind, reason):
    with pytest.raises(Invalid, match=reason):
        spec.validate(minimal_spec("0.6.0", kind))


@pytest.mark.parametrize("name, reason", [
    ("-x", "must start with a letter or digit"),
    ("x-", "must end with a letter or digit"),
    ("x=y", "invalid character '='"),
    ("x/y", "invalid character '/'"),
    ("", "empty device name"),
])
def test_invalid_device_names(name, reason):
    with pytest.raises(Invalid, match=reason):
        spec.validate(minimal_spec("0.5.0", name=name))


def test_device_names_may_hold_colons_and_dots():
    assert list(spec.validate(minimal_spec("0.5.0", name="0:1.a_b-c")).devices) == ["0:1.a_b-c"]


@pytest.mark.parametrize("edits, reason", [
    ({}, "device 'dev0' has no containerEdits"),
    ({"env": ["=x"]}, r"env\[0\]: '=x' is not NAME=VALUE"),
    ({"env": ["NOVALUE"]}, "is not NAME=VALUE"),
    ({"deviceNodes": [{"path": ""}]}, r"deviceNodes\[0\].path is empty"),
    ({"deviceNodes": [{"path": "/dev/x", "type": "z"}]}, "invalid device type 'z'"),
    ({"deviceNodes": [{"path": "/dev/x", "permissions": "rwx"}]}, "permissions: invalid 'rwx'"),
    ({"hooks": [{"hookName": "prestop", "path": "/bin/x"}]}, "hookName: invalid 'prestop'"),
    ({"hooks": [{"hookName": "poststop", "path": ""}]}, r"hooks\[0\].path is empty"),
    ({"hooks": [{"hookName": "poststop", "path": "/x", "env": ["X"]}]}, r"hooks\[0\].env\[0\]"),
    ({"mounts": [{"hostPath": "", "containerPath": "/x"}]}, "hostPath is empty"),
    ({"mounts": [{"hostPath": "/x", "containerPath": ""}]}, "containerPath is empty"),
])
def test_invalid_edits(edits, reason):
    s = minimal_spec("0.5.0")
    s["devices"][0]["containerEdits"] = edits
    with pytest.raises(Invalid, match=reason):
        spec.validate(s)


def test_valid_edit_details():
    s = minimal_spec("1.1.0", deviceNodes=[
        {"path": "/dev/a", "permissions": "none"}, {"path": "/dev/b", "permissions": "rw", "type": "b"},
        {"path": "/dev/c", "type": "p"}, {"path": "/dev/d", "type": "u"},
    ], intelRdt={"closID": "/"}, netDevices=[{"hostInterfaceName": "eth1", "name": "n1"}])
    spec.validate(s)


@pytest.mark.parametrize("rdt, reason", [
    ({"closID": "a/b"}, "closID: invalid"), ({"closID": ".."}, "closID: invalid"),
    ({"closID": "x" * 4096}, "closID: invalid"),
])
def test_invalid_rdt_class(rdt, reason):
    with pytest.raises(Invalid, match=reason):
        spec.validate(minimal_spec("0.7.0", intelRdt=rdt))


@pytest.mark.parametrize("nets, reason", [
    ([{"hostInterfaceName": "", "name": "a"}], "must both be set"),
    ([{"hostInterfaceName": "e", "name": "a"}, {"hostInterfaceName": "e", "name": "b"}], "moved twice"),
    ([{"hostInterfaceName": "e", "name": "a"}, {"hostInterfaceName": "f", "name": "a"}], "used twice"),
])
def test_invalid_net_devices(nets, reason):
    with pytest.raises(Invalid, match=reason):
        spec.validate(minimal_spec("1.1.0", netDevices=nets))


def test_a_device_defined_twice_in_one_file_is_invalid():
    s = minimal_spec("0.5.0")
    s["devices"].append(s["devices"][0])
    with pytest.raises(Invalid, match="device 'dev0' is defined twice"):
        spec.validate(s)


def test_spec_without_devices_is_invalid():
    s = minimal_spec("0.5.0")
    s["devices"] = []
    with pytest.raises(Invalid, match="no devices"):
        spec.validate(s)


@pytest.mark.parametrize("text, reason", [
    ("", "empty file"),
    ("cdiVersion: [", "invalid YAML"),
    ("{\"cdiVersion\": ", "invalid JSON"),
    ("- a\n- b\n", "not a CDI spec"),
    ("cdiVersion: 0.5.0\ncdiVersion: 0.6.0\n", "key 'cdiVersion' appears twice"),
    ('{"kind": "a/b", "kind": "a/c"}', "key 'kind' appears twice"),
])
def test_parse_errors_name_the_file(text, reason):
    with pytest.raises(SpecError, match=f"^spec.yaml: .*{reason}"):
        spec.parse(text, "spec.yaml")


def test_unquoted_mig_names_stay_strings():
    # nvidia-ctk writes MIG names unquoted; YAML 1.1 base 60 would make 1:0 the integer 60.
    text = ("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
            "- name: 1:0\n  containerEdits:\n    env: [A=1]\n")
    assert list(spec.parse(text, "x.yaml").devices) == ["1:0"]


def test_json_and_yaml_are_read_whatever_the_extension(tmp_path):
    a = write_spec(tmp_path, "a.yaml", minimal_spec(), fmt="json")
    b = write_spec(tmp_path, "b.json", minimal_spec(), fmt="yaml")
    assert spec.read(a).raw == spec.read(b).raw


def test_reading_a_fifo_fails_without_blocking(tmp_path):
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)
    with pytest.raises(SpecError, match="fifo.yaml: not a regular file"):
        spec.read(str(path))


def test_reading_a_missing_file_names_it(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml: cannot read CDI spec: No such file"):
        spec.read(str(tmp_path / "nope.yaml"))


def test_oversized_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(spec, "MAX_SPEC_BYTES", 100)
    path = write_spec(tmp_path, "big.yaml", minimal_spec() | {"x": "y" * 200})
    with pytest.raises(SpecError, match="too large"):
        spec.read(path)


@pytest.mark.parametrize("name, fmt, written", [
    ("out.json", "json", "out.json"),
    ("out.yaml", "yaml", "out.yaml"),
    ("out", "yaml", "out.yaml"),
    ("out.yml", "yaml", "out.yml.yaml"),
    ("sub/dir/out.json", "json", "sub/dir/out.json"),
])
def test_save_writes_a_file_cdi_runtimes_read(tmp_path, name, fmt, written):
    path = spec.save(minimal_spec(), str(tmp_path / name), fmt)
    assert path == str(tmp_path / written)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert spec.read(path).raw == minimal_spec()
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".nvct-")] == []


def test_save_replaces_an_existing_file_with_mode_0644(tmp_path):
    target = tmp_path / "s.yaml"
    target.write_text("old")
    target.chmod(0o600)
    spec.save(minimal_spec(), str(target), "yaml")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert spec.read(str(target)).raw == minimal_spec()


def test_read_sees_every_change_of_a_cached_spec_and_still_validates(tmp_path, monkeypatch):
    """The parse is cached by content (nvct.base.parsecache); validation runs on every read."""
    from nvct.base import parsecache

    monkeypatch.setattr(parsecache, "ROOT", str(tmp_path / "run"))
    path = write_spec(tmp_path, "a.yaml", minimal_spec(name="dev0"))
    assert list(spec.read(path).devices) == ["dev0"]
    assert list(spec.read(path).devices) == ["dev0"]
    st = os.stat(path)
    write_spec(tmp_path, "a.yaml", minimal_spec(name="dev1"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime: content decides
    assert list(spec.read(path).devices) == ["dev1"]
    write_spec(tmp_path, "a.yaml", {"cdiVersion": "0.5.0", "kind": "vendor.com/device", "devices": []})
    with pytest.raises(SpecError):
        spec.read(path)
    if os.geteuid() == 0:
        assert os.listdir(tmp_path / "run" / "cdi-spec-cache")
