"""``nvct toolkit install``'s flags and environment variables: the reference installer's names."""

from __future__ import annotations

import os
from unittest import mock

import click
import pytest

from nvct.cli import main
from nvct.cli.toolkit import toolkit_group
from nvct.toolkit import options as defaults


def _parse(args: list, env: dict | None = None) -> dict:
    command = toolkit_group.get_command(click.Context(toolkit_group), "install")
    with mock.patch.dict(os.environ, env or {}, clear=True):
        return command.make_context("install", list(args)).params


def test_defaults_are_the_reference_installers():
    params = _parse([])
    assert params["runtime"] == "docker"
    assert params["install_dir"] == "/usr/local/nvidia"
    assert params["pid_file"] == "/run/nvidia/toolkit/toolkit.pid"
    assert params["driver_root"] == "/run/nvidia/driver"
    assert params["set_as_default"] is True
    assert params["restart_mode"] is None  # per engine: signal, cri-o systemd
    assert params["host_root"] == "/host"


@pytest.mark.parametrize("env, name, value", [
    ({"RUNTIME": "containerd"}, "runtime", "containerd"),
    ({"TOOLKIT_INSTALL_DIR": "/opt/nv"}, "install_dir", "/opt/nv"),
    ({"ROOT": "/opt/nv"}, "install_dir", "/opt/nv"),
    ({"TOOLKIT_PID_FILE": "/run/x.pid"}, "pid_file", "/run/x.pid"),
    ({"NVIDIA_DRIVER_ROOT": "/"}, "driver_root", "/"),
    ({"RUNTIME_CONFIG": "/etc/c.toml"}, "config", "/etc/c.toml"),
    ({"CONTAINERD_CONFIG": "/etc/c.toml"}, "config", "/etc/c.toml"),
    ({"RUNTIME_SOCKET": "/run/c.sock"}, "socket", "/run/c.sock"),
    ({"RUNTIME_RESTART_MODE": "systemd"}, "restart_mode", "systemd"),
    ({"RUNTIME_DROP_IN_CONFIG": "/etc/c.d/n.toml"}, "drop_in_config", "/etc/c.d/n.toml"),
    ({"NO_DAEMON": "true"}, "no_daemon", True),
    ({"NO_RUNTIME_CONFIG": "1"}, "no_runtime_config", True),
    ({"CDI_ENABLED": "true"}, "cdi_enabled", True),
    ({"CONTAINERD_SET_AS_DEFAULT": "false"}, "set_as_default", False),
    ({"CONTAINERD_RUNTIME_CLASS": "gpu"}, "runtime_name", "gpu"),
    ({"HOST_ROOT_MOUNT": "/hostfs"}, "host_root", "/hostfs"),
    ({"NVCT_PROC_ROOT": "/sim/proc"}, "proc_root", "/sim/proc"),
])
def test_environment_variables_set_their_option(env, name, value):
    assert _parse([], env)[name] == value


def test_a_flag_beats_the_environment():
    assert _parse(["--runtime", "crio"], {"RUNTIME": "containerd"})["runtime"] == "crio"


def test_nvidia_visible_devices_is_not_an_installer_setting():
    assert _parse([], {"NVIDIA_VISIBLE_DEVICES": "void"}) == _parse([])


def test_unknown_runtime_is_refused_by_name(capsys):
    assert main(["toolkit", "install", "--runtime", "podman"]) == 2
    assert "Invalid value for '--runtime' / '-r': 'podman' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--runtime", "crio", "--restart-mode", "signal"], "nvct: --restart-mode=signal: cri-o cannot be reloaded"),
    (["--runtime-config-override", "{nope"], "nvct: --runtime-config-override: invalid JSON"),
    (["--runtime-config-override", "[1]"], "nvct: --runtime-config-override: expected a JSON object"),
    (["--config-source", "command=/etc/x"], "nvct: --config-source: 'command=/etc/x' is not supported"),
    (["--use-legacy-config"], "nvct: --use-legacy-config: a version 1 containerd config is not created"),
])
def test_bad_settings_are_one_line_errors_before_anything_is_done(tmp_path, capsys, args, message):
    code = main(["toolkit", "install", "--toolkit-install-dir", str(tmp_path / "install"),
                 "--pid-file", str(tmp_path / "toolkit.pid"), *args])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "install").exists() and not (tmp_path / "toolkit.pid").exists()


def test_lists_take_commas_and_repeats(monkeypatch):
    seen = {}
    monkeypatch.setattr("nvct.toolkit.run", lambda opts: seen.setdefault("opts", opts) and 0)
    with pytest.raises(SystemExit):
        toolkit_group.main(["install", "--nvidia-container-runtime.runtimes", "/usr/bin/crun,runc",
                            "--nvidia-container-runtime.runtimes", "runsc", "--config-source", "file",
                            "--runtime-config-override", '{"options": {"SystemdCgroup": true}}'],
                           standalone_mode=False)
    opts = seen["opts"]
    assert opts.low_level_runtimes == ["/usr/bin/crun", "runc", "runsc"]
    assert opts.config_sources == ["file"]
    assert opts.runtime_config_override == {"options": {"SystemdCgroup": True}}
    assert opts.create_device_nodes == ["control"]
    assert isinstance(opts, defaults.Options)
