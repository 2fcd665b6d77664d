"""The installed config.toml: nvct's defaults, the node's roots, the toolkit's paths."""

from __future__ import annotations

import pytest

from nvct.base.errors import ConfigError
from nvct.config.file import parse_toml
from nvct.toolkit import Layout, Options
from nvct.toolkit.configfile import DEFAULT_LDCONFIG, ldconfig, render, settings


def test_settings_are_the_reference_installers_plus_nvcts_roots():
    layout = Layout.for_install_dir("/usr/local/nvidia")
    opts = Options(driver_root="/run/nvidia/driver", proc_root="/sim/proc",
                   opt_in_features=["disable-cuda-compat-lib-hook"])
    values = settings(opts.resolved(), layout, ["/usr/bin/runc", "runc", "crun"])
    assert values["nvidia-container-cli.root"] == "/run/nvidia/driver"
    assert values["nvidia-container-runtime.runtimes"] == ["/usr/bin/runc", "runc", "crun"]
    assert values["nvidia-container-runtime-hook.path"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"
    assert values["nvct.path"] == "/usr/local/nvidia/toolkit/nvct"
    assert values["nvct.proc-root"] == "/sim/proc"
    assert "nvct.dev-root" not in values  # unset: the host's /dev
    assert values["features.disable-cuda-compat-lib-hook"] is True
    assert "nvidia-container-runtime.mode" not in values


def test_render_forces_the_mode_and_keeps_the_rest():
    values = {"nvidia-container-cli.root": "/", "nvidia-container-runtime.mode": "jit-cdi"}
    plain = parse_toml(render(values).encode(), "t")
    legacy = parse_toml(render(values, "legacy").encode(), "t")
    assert plain["nvidia-container-runtime"]["mode"] == "jit-cdi"
    assert legacy["nvidia-container-runtime"]["mode"] == "legacy"
    legacy["nvidia-container-runtime"]["mode"] = "jit-cdi"
    assert legacy == plain


def test_render_refuses_a_config_nvct_would_not_load():
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        render({"nvidia-container-runtime.mode": "fast"})


def test_ldconfig_prefers_the_driver_roots_own(tmp_path):
    assert ldconfig("/run/nvidia/driver", str(tmp_path)) == DEFAULT_LDCONFIG
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "ldconfig").write_text("")
    assert ldconfig("/run/nvidia/driver", str(tmp_path)) == "@/run/nvidia/driver/sbin/ldconfig"
    (tmp_path / "sbin" / "ldconfig.real").write_text("")
    assert ldconfig("/", str(tmp_path)) == "@/sbin/ldconfig.real"
