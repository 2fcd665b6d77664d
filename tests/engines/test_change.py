"""The undo record: byte-identical round trips, repeated configures, edits by others."""

from __future__ import annotations

import json
import os

import pytest

from nvct import engines as runtimes
from nvct.base.errors import ConfigError
from nvct.engines.record import load_record

NVIDIA = "/usr/bin/nvidia-container-runtime"
DAEMON_JSON = b'{\n  "log-driver": "json-file",\n  "default-runtime": "runc"\n}\n'


@pytest.fixture
def daemon_json(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_bytes(DAEMON_JSON)
    return path


def test_configure_writes_backup_and_record_beside_the_config(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia")
    assert (daemon_json.parent / "daemon.json.nvct.bak").read_bytes() == DAEMON_JSON
    record = load_record(str(daemon_json))
    assert record["engine"] == "docker"
    [layer] = record["layers"]
    assert layer["owner"] == runtimes.CLI_OWNER
    [entry] = layer["files"]
    assert entry["original"] == {"exists": True, "text": DAEMON_JSON.decode()}
    assert oct(os.stat(daemon_json.parent / "daemon.json.nvct-undo").st_mode & 0o777) == "0o600"


def test_unconfigure_is_byte_identical_and_cleans_up(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia", cdi=True)
    runtimes.unconfigure("docker", str(daemon_json))
    assert daemon_json.read_bytes() == DAEMON_JSON
    assert os.listdir(daemon_json.parent) == ["daemon.json"]


def test_repeated_configure_keeps_the_first_original(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA})
    runtimes.configure("docker", str(daemon_json), {"nvidia-cdi": NVIDIA + ".cdi"}, set_default="nvidia-cdi")
    runtimes.configure("docker", str(daemon_json), {"nvidia": "/other/path"})
    assert (daemon_json.parent / "daemon.json.nvct.bak").read_bytes() == DAEMON_JSON
    runtimes.unconfigure("docker", str(daemon_json))
    assert daemon_json.read_bytes() == DAEMON_JSON


def test_configure_twice_with_the_same_flags_changes_nothing_the_second_time(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA})
    written = daemon_json.read_bytes()
    change = runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA})
    assert not change.changed and change.diff() == ""
    assert daemon_json.read_bytes() == written


def test_edits_by_others_are_kept_and_only_nvcts_keys_reverted(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia")
    data = json.loads(daemon_json.read_text())
    data["debug"] = True
    data["runtimes"]["kata"] = {"path": "/usr/bin/kata"}
    daemon_json.write_text(json.dumps(data, indent=2))
    change = runtimes.unconfigure("docker", str(daemon_json))
    assert json.loads(daemon_json.read_text()) == {
        "log-driver": "json-file", "default-runtime": "runc", "runtimes": {"kata": {"path": "/usr/bin/kata"}},
        "debug": True}
    assert any("by someone else: runtimes.kata, debug)" in n and "reverted nvct's own keys only" in n
               for n in change.notes), change.notes
    assert any("kept" in n and "nvct.bak" in n for n in change.notes)


def test_a_value_someone_changed_after_nvct_is_left_alone(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia")
    data = json.loads(daemon_json.read_text())
    data["default-runtime"] = "crun"
    daemon_json.write_text(json.dumps(data))
    change = runtimes.unconfigure("docker", str(daemon_json))
    assert json.loads(daemon_json.read_text()) == {"log-driver": "json-file", "default-runtime": "crun"}
    assert any("left default-runtime alone" in n for n in change.notes)


def test_configure_after_someone_edited_the_file_records_their_value(daemon_json):
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia")
    data = json.loads(daemon_json.read_text())
    data["default-runtime"] = "crun"
    daemon_json.write_text(json.dumps(data))
    runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia")
    runtimes.unconfigure("docker", str(daemon_json))
    assert json.loads(daemon_json.read_text()) == {"log-driver": "json-file", "default-runtime": "crun"}


def test_a_record_left_by_a_crash_before_the_write_is_harmless(daemon_json):
    change = runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, dry_run=True)
    from nvct.engines.change import _write_record
    from nvct.engines.record import record_path

    _write_record(record_path(str(daemon_json)), change.record)  # the record, but not the config
    runtimes.unconfigure("docker", str(daemon_json))
    assert daemon_json.read_bytes() == DAEMON_JSON
    assert os.listdir(daemon_json.parent) == ["daemon.json"]


def test_dry_run_writes_nothing_and_diffs(daemon_json):
    change = runtimes.configure("docker", str(daemon_json), {"nvidia": NVIDIA}, set_default="nvidia", dry_run=True)
    assert os.listdir(daemon_json.parent) == ["daemon.json"]
    diff = change.diff()
    assert diff.startswith(f"--- {daemon_json}\n+++ {daemon_json}\n@@ ")
    assert '-  "default-runtime": "runc"\n' in diff and '+  "default-runtime": "nvidia",\n' in diff


def test_diff_of_a_new_file_is_from_dev_null(tmp_path):
    change = runtimes.configure("docker", str(tmp_path / "daemon.json"), {"nvidia": NVIDIA}, dry_run=True)
    assert change.diff().startswith(f"--- /dev/null\n+++ {tmp_path}/daemon.json\n")


def test_unreadable_record_is_a_one_line_error(daemon_json):
    (daemon_json.parent / "daemon.json.nvct-undo").write_text("{nope")
    with pytest.raises(ConfigError, match=r"daemon.json.nvct-undo: nvct's undo record is unreadable .*; "
                                          r"remove it to unconfigure without it$"):
        runtimes.unconfigure("docker", str(daemon_json))
    assert daemon_json.read_bytes() == DAEMON_JSON


def test_symlinked_config_is_written_through_the_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_bytes(DAEMON_JSON)
    link = tmp_path / "daemon.json"
    link.symlink_to(real)
    runtimes.configure("docker", str(link), {"nvidia": NVIDIA})
    assert link.is_symlink()
    assert "nvidia" in json.loads(real.read_text())["runtimes"]
    runtimes.unconfigure("docker", str(link))
    assert link.is_symlink() and real.read_bytes() == DAEMON_JSON


def test_hook_file_round_trip(tmp_path):
    hook = tmp_path / "hooks.d" / "oci-nvidia-hook.json"
    runtimes.configure_hook(str(hook), "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook")
    assert json.loads(hook.read_text()) == {
        "version": "1.0.0",
        "hook": {"path": "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook",
                 "args": ["nvidia-container-runtime-hook", "prestart"],
                 "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:"
                         "/usr/local/nvidia/toolkit"]},
        "when": {"always": True, "commands": [".*"]},
        "stages": ["prestart"],
    }
    # Only *.json files are hooks: the undo record must not be one.
    assert sorted(os.listdir(hook.parent)) == ["oci-nvidia-hook.json", "oci-nvidia-hook.json.nvct-undo"]
    runtimes.unconfigure_hook(str(hook))
    assert not hook.parent.exists()


def test_hook_json_matches_the_reference_layout():
    assert runtimes.hook_json("/usr/bin/nvidia-container-runtime-hook") == '''\
{
  "version": "1.0.0",
  "hook": {
    "path": "/usr/bin/nvidia-container-runtime-hook",
    "args": [
      "nvidia-container-runtime-hook",
      "prestart"
    ],
    "env": [
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    ]
  },
  "when": {
    "always": true,
    "commands": [
      ".*"
    ]
  },
  "stages": [
    "prestart"
  ]
}
'''


def test_hook_binary_must_be_absolute(tmp_path):
    with pytest.raises(ConfigError, match="must be absolute"):
        runtimes.configure_hook(str(tmp_path / "h.json"), "nvidia-container-runtime-hook")
