"""Unknown config keys: found and named (typos), never refused (a newer reference's keys must keep working)."""

from __future__ import annotations

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
