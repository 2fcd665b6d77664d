import json

import pytest

from nvct.base.errors import SpecError
from nvct.oci import spec as ocispec


def test_round_trip_keeps_unknown_fields(tmp_path):
    spec = {"ociVersion": "1.0.2-dev", "process": {"env": ["A=1"]}, "root": {"path": "rootfs"},
            "x-vendor": {"keep": [1, 2]}, "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO"}}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    loaded = ocispec.load(str(tmp_path))
    ocispec.save(str(tmp_path), loaded)
    assert json.loads((tmp_path / "config.json").read_text()) == spec
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temp file left


@pytest.mark.parametrize("content, message", [
    ("{", "cannot read OCI spec"), ("[]", "OCI spec is not a JSON object"),
])
def test_bad_spec_is_one_line_naming_the_file(tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(SpecError, match=f"{tmp_path}/config.json: {message}"):
        ocispec.load(str(tmp_path))


def test_nvidia_prestart_hooks_detected_and_removed():
    spec = {"hooks": {"prestart": [{"path": "/proc/123/exe", "args": ["libnetwork-setkey"]},
                                   {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}]}}
    assert ocispec.has_nvidia_hook(spec)
    assert ocispec.remove_nvidia_hooks(spec) == 1
    assert spec["hooks"]["prestart"] == [{"path": "/proc/123/exe", "args": ["libnetwork-setkey"]}]
    assert not ocispec.has_nvidia_hook(spec)


def test_rootfs_relative_to_bundle():
    assert ocispec.rootfs({"root": {"path": "rootfs"}}, "/b") == "/b/rootfs"
    assert ocispec.rootfs({"root": {"path": "/abs/r"}}, "/b") == "/abs/r"
    with pytest.raises(SpecError, match="root.path is missing"):
        ocispec.rootfs({}, "/b")
    assert ocispec.rootfs({"root": {"path": "/a//b/../r/"}}, "/b") == "/a/r"  # cleaned, as runc does
    assert ocispec.rootfs({"root": {"path": "//r"}}, "/b") == "/r"


def test_a_relative_root_is_joined_to_the_bundles_real_path(tmp_path):
    """runc joins it to its working directory, the bundle as getcwd(3) shows it: no symlinks."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert ocispec.rootfs({"root": {"path": "rootfs"}}, str(tmp_path / "link")) == str(tmp_path / "real/rootfs")


@pytest.mark.parametrize("maps, owners", [
    (None, ()),
    ([{"containerID": 0, "hostID": 100000, "size": 65536}], (100000,)),
    ([{"containerID": 1, "hostID": 200001, "size": 10}, {"containerID": 0, "hostID": 5000, "size": 1}], (5000,)),
    ([{"containerID": 1000, "hostID": 1000, "size": 1}], ()),  # root not mapped
    ([{"containerID": "0", "hostID": 1, "size": 1}, "x"], ()),  # malformed: ignored, the runtime says so
])
def test_root_owners_is_the_host_uid_of_the_containers_root(maps, owners):
    spec = {"linux": {"uidMappings": maps}} if maps is not None else {}
    assert ocispec.root_owners(spec) == owners


@pytest.mark.parametrize("spec, line", [
    ({"process": {"env": "A=b"}}, "process.env must be an array, not a string"),
    ({"process": {"env": ["A=b", 1]}}, "process.env must hold only strings, not a number"),
    ({"annotations": ["x"]}, "annotations must be an object, not an array"),
    ({"annotations": {"a": 1}}, "annotations must hold only strings, not a number"),
    ({"mounts": [{"destination": 3}]}, "mounts[0].destination must be a string, not a number"),
    ({"mounts": [{"options": "ro"}]}, "mounts[0].options must be an array of strings"),
    ({"process": {"user": {"uid": "0"}}}, "process.user.uid must be a number, not a string"),
    ({"root": {"path": None}}, None),
    ({"process": {"env": ["A=b"]}, "mounts": [], "linux": {"devices": []}}, None),
])
def test_shape_problem_names_the_field(spec, line):
    assert ocispec.shape_problem(spec) == line


def test_load_refuses_a_wrongly_typed_field(tmp_path):
    (tmp_path / "config.json").write_text('{"process": {"env": {"A": "b"}}}')
    with pytest.raises(SpecError, match="config.json: process.env must be an array, not an object"):
        ocispec.load(str(tmp_path))
