"""Unknown config keys: found and named (typos), never refused (a newer reference's keys must keep working)."""

from __future__ import annotations

import pytest

from nvct.config import file as config_mod, keys as configkeys


def _keys(table: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict) and value:
            out += _keys(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def test_every_key_nvct_knows_is_known():
    assert configkeys.unknown(config_mod.DEFAULTS) == []


def test_typos_are_named_in_file_order_at_every_level():
    data = config_mod.parse_toml(b'dissable-require = true\n[nvidia-container-runtime]\nmod = "legacy"\n'
                                 b'[nvidia-container-runtime.modes.cdi]\nspec-dir = ["/x"]\n'
                                 b'[features]\nallow-ldconfig-from-contianer = true\n[nvct]\ndev-rot = "/"\n', "t")
    assert configkeys.unknown(data) == ["dissable-require", "nvidia-container-runtime.mod",
                                        "nvidia-container-runtime.modes.cdi.spec-dir",
                                        "features.allow-ldconfig-from-contianer", "nvct.dev-rot"]


def test_keys_of_any_reference_release_are_not_typos():
    data = config_mod.parse_toml(
        b'alpha-merge-visible-devices-envvars = false\n'
        b'[nvidia-container-cli]\nno-pivot = false\n'
        b'[nvidia-container-runtime]\nexperimental = false\ndiscover-mode = "auto"\n'
        b'[nvidia-container-runtime.modes.jit-cdi]\nnvcdi-feature-flags = []\n'
        b'[nvidia-container-runtime.modes.csv]\ncompat-container-root = "/x"\n'
        b'[features]\ngds = true\ninclude-persistenced-socket = true\n', "t")
    assert configkeys.unknown(data) == []


def test_a_config_with_unknown_keys_still_loads_and_keeps_its_settings():
    config = config_mod.Config(config_mod.parse_toml(b'[nvidia-container-runtime]\nmode = "cdi"\n'
                                                     b'some-future-key = 3\n', "t"), "/etc/x.toml")
    assert config.mode == "cdi"
    assert config.unknown_keys_warning() == ("/etc/x.toml: unknown key 'nvidia-container-runtime.some-future-key' "
                                             "ignored (a typo? 'nvct config default' lists every key)")
    assert config_mod.Config({}, "/etc/x.toml").unknown_keys_warning() is None


def test_the_table_gives_each_key_its_accessor_default_and_example():
    from nvct.config import render

    config = config_mod.Config(config_mod.parse_toml(
        b'swarm-resource = "X"\n[nvidia-container-cli]\nload-kmods = false\n'
        b'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["/x"]\n[features]\ngds = true\n', "t"), "t", env={})
    assert config.swarm_resource == "X" and config.cli_load_kmods is False and config.cdi_spec_dirs == ["/x"]
    assert config.feature_gds is True and config.allow_ldconfig_from_container is False
    assert config.cli_no_pivot is None  # no default: as the file has it, None when unset
    assert config_mod.Config(None, None, env={}).cli_load_kmods is True
    for row in configkeys.KEYS:
        assert getattr(type(config), row.attr) is row and row.attr.isidentifier()
        node: object = config_mod.DEFAULTS
        for part in row.name.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        assert node == (None if row.default is configkeys.ABSENT else row.default), row.name
    assert render.EXAMPLES["nvidia-container-cli.root"] == "/run/nvidia/driver"
    assert "ignore-imex-channel-requests" in render.FEATURES and "gds" not in render.FEATURES
    with pytest.raises(AttributeError):
        config.mode = "cdi"  # the file decides; an accessor is never assigned


def test_no_module_reads_a_key_by_its_dotted_name():
    # Convention (docs/contributing.md): a key is read through its accessor, so the table is its one home.
    import pathlib
    import re

    names = {row.name for row in configkeys.KEYS}
    root = pathlib.Path(config_mod.__file__).parents[1]
    found = [f"{p.relative_to(root.parent)}:{i}: {m.group(0)}"
             for p in sorted(root.rglob("*.py")) if p.parent.name != "config"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             for m in re.finditer(r'\.get\("([a-z0-9.-]+)"', line) if m.group(1) in names]
    assert found == []
