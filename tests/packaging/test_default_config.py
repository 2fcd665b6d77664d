"""config/config.toml and hooks/oci-nvidia-hook.json: what the packages install."""

from __future__ import annotations

import json
import re

from nvct import cli
from nvct.config import file as config
from nvct.engines import ocihook
from tests.packaging.pkgtest import REPO

CONFIG = REPO / "config" / "config.toml"
OCI_HOOK = REPO / "hooks" / "oci-nvidia-hook.json"


def test_shipped_config_is_what_nvct_config_default_prints(capsys):
    # The packages' post-install normalization then never rewrites an untouched file.
    assert cli.main(["config", "default"]) == 0
    assert capsys.readouterr().out == CONFIG.read_text()


def test_shipped_config_sets_exactly_the_builtin_defaults():
    shipped = config.Config(config.parse_toml(CONFIG.read_bytes(), str(CONFIG)), str(CONFIG), env={})
    assert shipped.data == config.Config(None, None, env={}).data


def test_every_commented_example_names_a_known_setting():
    table: list[str] = []
    examples = []
    for line in CONFIG.read_text().splitlines():
        header = re.fullmatch(r"\[(.+)\]", line)
        if header:
            table = header.group(1).split(".")
        elif line.startswith("#"):
            examples.append((table, line[1:]))
    assert examples, "the reference's layout shows commented examples"
    for table, line in examples:
        key, _, value = line.partition(" = ")
        node = config.DEFAULTS
        for part in table:
            node = node[part]
        assert key in node, f"[{'.'.join(table)}] #{key}: not a setting nvct knows"
        parsed = config.parse_toml(line.encode(), "example")[key]
        default = node[key]
        assert type(parsed) is type(default), f"#{line}: a {type(default).__name__} setting"


def test_oci_hook_is_what_nvct_runtime_configure_writes():
    assert OCI_HOOK.read_text() == ocihook.hook_json()


def test_oci_hook_runs_the_packaged_hook_before_every_container_starts():
    hook = json.loads(OCI_HOOK.read_text())
    assert hook["version"] == "1.0.0"
    assert hook["stages"] == ["prestart"]
    assert hook["when"] == {"always": True, "commands": [".*"]}
    # The path both packages install it at; args[0] as a shell would give it.
    assert hook["hook"]["path"] == "/usr/bin/nvidia-container-runtime-hook"
    assert hook["hook"]["args"] == ["nvidia-container-runtime-hook", "prestart"]
    # podman runs hooks with exactly this environment, not even a PATH otherwise.
    (path,) = [e for e in hook["hook"]["env"] if e.startswith("PATH=")]
    assert "/usr/bin" in path.split("=", 1)[1].split(":")
