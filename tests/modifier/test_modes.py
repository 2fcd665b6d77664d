"""What the shim records for its sh front to insert in legacy mode (nvct.modifier.modes.legacy_record)."""

import json
import sys

import pytest

from nvct.config.file import Config
from nvct.edits import apply
from nvct.edits.model import HOOK_PATH
from nvct.modifier import modes
from nvct.oci import spec as ocispec


@pytest.fixture
def program(tmp_path, monkeypatch):
    """An installed shim with the hook beside it, as sys.argv[0]."""
    shim = tmp_path / "bin" / "nvidia-container-runtime"
    shim.parent.mkdir()
    for path in (shim, shim.parent / "nvidia-container-runtime-hook"):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(shim)])
    return str(shim)


def _config(runtime=None, hook=None, path="/etc/nvidia-container-runtime/config.toml"):
    data = {"nvidia-container-runtime": {"mode": "legacy", **(runtime or {})},
            "nvidia-container-cli": {"no-cgroups": True}}  # else the device rules need Python
    if hook:
        data["nvidia-container-runtime-hook"] = hook
    return Config(data, path=path)


@pytest.mark.parametrize("key, log_format", [("hook", None), ("hook_json", "json"), ("hook_text", "text")])
def test_the_record_holds_the_whole_hook_legacy_mode_appends_for_each_log_format(program, key, log_format):
    config = _config()
    record = modes.legacy_record(config, program)
    assert json.loads(record[key]) == apply.hook_entry(modes.legacy_hook(config, log_format))
    hook = program.replace("nvidia-container-runtime", "nvidia-container-runtime-hook")
    assert json.loads(record[key])["path"] == record["hook_path"] == hook
    assert record["nvidia_hooks"].split() == list(ocispec.NVIDIA_HOOK_NAMES)


def test_a_config_without_a_file_names_none(program):
    entry = json.loads(modes.legacy_record(_config(path=None), program)["hook"])
    assert not any(e.startswith("NVIDIA_CTK_CONFIG_FILE_PATH=") for e in entry["env"])


def test_a_hook_path_with_a_quote_is_recorded_as_json_escapes_it(program):
    record = modes.legacy_record(_config(None, {"path": '/opt/with"quote/hook'}), program)
    assert json.loads(record["hook"])["path"] == record["hook_path"] == '/opt/with"quote/hook'


@pytest.mark.parametrize("runtime, hook, program_path", [
    ({"mode": "jit-cdi"}, None, None),
    ({"mode": "auto"}, None, None),
    ({"debug": "/var/log/nvidia-container-runtime.log"}, None, None),  # a line per start to write
    (None, None, "relative/nvidia-container-runtime"),
])
def test_nothing_is_recorded_where_the_front_could_not_do_exactly_what_python_does(
        program, runtime, hook, program_path):
    assert modes.legacy_record(_config(runtime, hook), program_path or program) is None


def test_a_hook_found_on_path_is_not_recorded(program, tmp_path, monkeypatch):
    (tmp_path / "bin" / "nvidia-container-runtime-hook").unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert modes.legacy_hook_path(_config()) == "/usr/bin/nvidia-container-runtime-hook"
    assert modes.legacy_record(_config(), program) is None


def test_an_absolute_hook_path_and_a_log_to_dev_null_are_recorded(program):
    config = _config({"debug": "/dev/null"}, {"path": "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"})
    entry = json.loads(modes.legacy_record(config, program)["hook"])
    assert entry["path"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"


def test_a_utility_folder_on_the_engines_path_goes_first_on_the_legacy_hooks_and_keeps_it_in_python(
        program, tmp_path, monkeypatch):
    """The hook finds the driver's utilities on its PATH; a folder only this caller's PATH names
    cannot go into a record the sh front pastes for every caller."""
    smi = tmp_path / "usr/local/nvidia/bin/nvidia-smi"
    smi.parent.mkdir(parents=True)
    smi.write_text("")
    smi.chmod(0o755)
    config = Config({"nvidia-container-runtime": {"mode": "legacy"},
                     "nvidia-container-cli": {"no-cgroups": True, "root": str(tmp_path)}},
                    path="/etc/nvidia-container-runtime/config.toml")
    monkeypatch.setenv("PATH", "/usr/bin:/usr/local/nvidia/bin:/opt/other/bin")
    assert modes.legacy_hook(config).env[0] == f"PATH=/usr/local/nvidia/bin:{HOOK_PATH}"
    assert modes.legacy_record(config, program) is None
    monkeypatch.setenv("PATH", "/usr/bin:/opt/other/bin")
    assert modes.legacy_hook(config).env[0] == f"PATH={HOOK_PATH}"
    assert modes.legacy_record(config, program) is not None
