from __future__ import annotations

import json
import os

import pytest

from nvct import engines as runtimes
from nvct.base.errors import ConfigError

NVIDIA = "/usr/bin/nvidia-container-runtime"


def _configure(path, **kwargs):
    kwargs.setdefault("runtimes", {"nvidia": NVIDIA})
    return runtimes.configure("docker", str(path), **kwargs)


def _read(path):
    with open(path) as f:
        return json.load(f)


def test_missing_file_is_created_with_the_runtime(tmp_path):
    path = tmp_path / "etc" / "docker" / "daemon.json"
    _configure(path)
    assert _read(path) == {"runtimes": {"nvidia": {"path": NVIDIA, "runtimeArgs": []}}}
    assert path.read_text().endswith("}\n")


def test_empty_file_counts_as_an_empty_object(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("\n")
    _configure(path, set_default="nvidia")
    assert _read(path) == {"runtimes": {"nvidia": {"path": NVIDIA, "runtimeArgs": []}},
                           "default-runtime": "nvidia"}


def test_writes_runtimeArgs_which_dockerd_reads_not_args(tmp_path):
    path = tmp_path / "daemon.json"
    _configure(path)
    assert "args" not in _read(path)["runtimes"]["nvidia"]


def test_existing_runtimes_and_other_keys_are_kept_in_order(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{\n  "log-driver": "json-file",\n  "runtimes": {\n    "kata": {"path": "/usr/bin/kata"}\n'
                    '  },\n  "storage-driver": "overlay2"\n}\n')
    _configure(path)
    data = _read(path)
    assert list(data) == ["log-driver", "runtimes", "storage-driver"]
    assert list(data["runtimes"]) == ["kata", "nvidia"]
    assert data["runtimes"]["kata"] == {"path": "/usr/bin/kata"}
    assert path.read_text().startswith('{\n  "log-driver"')


def test_cdi_keeps_the_other_features(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"features": {"buildkit": true, "containerd-snapshotter": false}}')
    _configure(path, cdi=True)
    assert _read(path)["features"] == {"buildkit": True, "containerd-snapshotter": False, "cdi": True}


def test_replaced_default_runtime_is_restored_by_unconfigure(tmp_path):
    path = tmp_path / "daemon.json"
    original = b'{\n    "default-runtime": "crun",\n    "runtimes": {"crun": {"path": "/usr/bin/crun"}}\n}\n'
    path.write_bytes(original)
    _configure(path, set_default="nvidia")
    assert _read(path)["default-runtime"] == "nvidia"
    runtimes.unconfigure("docker", str(path))
    assert path.read_bytes() == original


def test_configure_without_set_as_default_leaves_the_default_alone(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/old"}}}')
    _configure(path)
    data = _read(path)
    assert data["default-runtime"] == "nvidia"
    assert data["runtimes"]["nvidia"] == {"path": NVIDIA, "runtimeArgs": []}


def test_runtime_named_runc_is_refused_like_dockerd_does(tmp_path):
    path = tmp_path / "daemon.json"
    with pytest.raises(ConfigError, match="runtime name 'runc' is reserved by docker"):
        _configure(path, runtimes={"runc": NVIDIA})
    assert not path.exists()


@pytest.mark.parametrize("content,message", [
    ('["a"]', "not a JSON object (top level is a JSON array)"),
    ('{"runtimes": []}', "runtimes is not a table/object"),
    ('{"runtimes": {}, "default-runtime": 1}', "default-runtime is not a string"),
    ('{"runtimes": {\n}, }', "invalid JSON: line 2, column 4: Expecting property name enclosed in double quotes"),
])
def test_bad_daemon_json_is_one_error_and_the_file_is_unchanged(tmp_path, content, message):
    path = tmp_path / "daemon.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        _configure(path)
    assert str(e.value) == f"{path}: {message}"
    assert path.read_text() == content
    assert sorted(os.listdir(tmp_path)) == ["daemon.json"]


def test_features_that_is_not_an_object_is_an_error_with_cdi(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"features": true}')
    with pytest.raises(ConfigError, match=r"features is not a table/object$"):
        _configure(path, cdi=True)


def test_docker_has_no_drop_in_files(tmp_path):
    with pytest.raises(ConfigError, match="docker does not read drop-in config files"):
        _configure(tmp_path / "daemon.json", drop_in=str(tmp_path / "d.json"))


def test_unconfigure_without_record_removes_by_name(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/x"}}, "debug": true}')
    change = runtimes.unconfigure("docker", str(path))
    assert _read(path) == {"debug": True}
    assert any("no nvct undo record" in n for n in change.notes)


def test_low_level_runtime_paths_reads_the_configured_runtimes(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"default-runtime": "crun", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}')
    assert runtimes.low_level_runtime_paths("docker", str(path)) == ["/usr/bin/crun"]
