"""Where the installer puts things."""

from __future__ import annotations

from nvct.toolkit import Layout


def test_everything_is_under_install_dir_slash_toolkit():
    layout = Layout.for_install_dir("/usr/local/nvidia")
    assert layout.root == "/usr/local/nvidia/toolkit"
    assert layout.config() == "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"
    assert layout.config("cdi") == "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.cdi.toml"
    versioned = layout.with_version("nvct-1")
    assert versioned.entry == "/usr/local/nvidia/toolkit/.runtime/nvct-1/lib/python/nvct/toolkit/entry.py"
    assert versioned.moved("/x").runtime_dir == "/x/.runtime/nvct-1"
    assert layout.hook == "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook"
    assert layout.nvct == "/usr/local/nvidia/toolkit/nvct"


def test_the_engine_gets_three_runtimes():
    layout = Layout.for_install_dir("/usr/local/nvidia/")
    assert layout.runtimes() == {
        "nvidia": "/usr/local/nvidia/toolkit/nvidia-container-runtime",
        "nvidia-cdi": "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi",
        "nvidia-legacy": "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy",
    }
    assert set(layout.runtimes("gpu")) == {"gpu", "nvidia-cdi", "nvidia-legacy"}
