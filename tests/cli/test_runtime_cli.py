"""``nvct runtime configure|unconfigure``: flags, output, and one-line errors."""

from __future__ import annotations

import json
import os

import pytest

from nvct.cli import main

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.9/3.10
    tomllib = None


def _toml(text):
    if tomllib is None:  # pragma: no cover
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)


def nvct(capsys, *args):
    rc = main(["runtime", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_docker_configure_with_the_reference_flags(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    rc, out, err = nvct(capsys, "configure", "--runtime", "docker", "--config", str(path),
                        "--nvidia-runtime-name", "gpu", "--runtime-path", "/opt/nvct/nvidia-container-runtime",
                        "--nvidia-set-as-default", "--enable-cdi")
    assert rc == 0 and out == ""
    assert json.loads(path.read_text()) == {
        "runtimes": {"gpu": {"path": "/opt/nvct/nvidia-container-runtime", "runtimeArgs": []}},
        "default-runtime": "gpu", "features": {"cdi": True}}
    assert f"nvct: wrote {path}\n" in err
    assert "reload dockerd (SIGHUP) or restart it" in err


def test_docker_default_runtime_path_is_the_bare_name(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    assert nvct(capsys, "configure", "--config", str(path))[0] == 0
    assert json.loads(path.read_text())["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_containerd_default_runtime_path_becomes_absolute_and_drop_in_is_beside_config(tmp_path, capsys):
    config = tmp_path / "config.toml"
    rc, _, _ = nvct(capsys, "configure", "--runtime", "containerd", "--config", str(config),
                    "--set-as-default", "--cdi.enabled")
    assert rc == 0
    drop_in = _toml((tmp_path / "conf.d" / "99-nvidia.toml").read_text())
    cri = drop_in["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["enable_cdi"] is True
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert _toml(config.read_text())["imports"] == [f"{tmp_path}/conf.d/*.toml"]


def test_empty_drop_in_config_edits_the_main_file(tmp_path, capsys):
    config = tmp_path / "config.toml"
    assert nvct(capsys, "configure", "--runtime", "containerd", "--config", str(config),
                "--drop-in-config", "")[0] == 0
    assert "nvidia" in _toml(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert not (tmp_path / "conf.d").exists()


def test_relative_runtime_path_is_refused_for_containerd(tmp_path, capsys):
    rc, _, err = nvct(capsys, "configure", "--runtime", "containerd", "--config", str(tmp_path / "c.toml"),
                      "--nvidia-runtime-path", "bin/nvidia-container-runtime")
    assert rc == 1
    assert err == "nvct: bin/nvidia-container-runtime: the NVIDIA runtime path must be an absolute path\n"
    assert os.listdir(tmp_path) == []


def test_dry_run_prints_a_diff_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    path.write_text('{"default-runtime": "runc"}\n')
    rc, out, _ = nvct(capsys, "configure", "--config", str(path), "--set-as-default", "--dry-run")
    assert rc == 0
    assert out.startswith(f"--- {path}\n+++ {path}\n@@ -1 +1,9 @@\n-{{\"default-runtime\": \"runc\"}}\n+{{\n")
    assert '+    "default-runtime": "nvidia",\n' in out
    assert os.listdir(tmp_path) == ["daemon.json"]


def test_configure_then_unconfigure_is_byte_identical(tmp_path, capsys):
    config = tmp_path / "config.toml"
    original = (b'# keep me\nversion = 2\n\n'
                b'[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n')
    config.write_bytes(original)
    assert nvct(capsys, "configure", "--runtime", "containerd", "--config", str(config), "--set-as-default")[0] == 0
    rc, _, err = nvct(capsys, "unconfigure", "--runtime", "containerd", "--config", str(config))
    assert rc == 0, err
    assert config.read_bytes() == original
    assert os.listdir(tmp_path) == ["config.toml"]


def test_unconfigure_with_nothing_there_is_an_error(tmp_path, capsys):
    rc, _, err = nvct(capsys, "unconfigure", "--runtime", "docker", "--config", str(tmp_path / "daemon.json"))
    assert rc == 1
    assert err == (f"nvct: {tmp_path}/daemon.json: no such config file (nor drop-in, nor nvct undo record): "
                   f"nothing to unconfigure\n")


@pytest.mark.parametrize("engine,name,content,message", [
    ("docker", "daemon.json", '{"a": 1,,}', "invalid JSON: line 1, column 9: Expecting property name"),
    ("docker", "daemon.json", '"just a string"', "not a JSON object (top level is a JSON string)"),
    ("docker", "daemon.json", '{"runtimes": ["nvidia"]}', "runtimes is not a table/object"),
    ("containerd", "config.toml", "version = 2\n[x]\na = 1\na = 2\n", "invalid TOML: line 4, column "),
    ("containerd", "config.toml", "version = 9\n", "unsupported containerd config version 9"),
    ("containerd", "config.toml", "[plugins\n", "invalid TOML: line 1, column "),
    ("crio", "crio.conf", "[crio.runtime]\ndefault_runtime = \n", "invalid TOML: line 2, column "),
])
def test_bad_input_is_one_line_naming_the_file_and_nothing_changes(tmp_path, capsys, engine, name, content,
                                                                   message):
    path = tmp_path / name
    path.write_text(content)
    rc, out, err = nvct(capsys, "configure", "--runtime", engine, "--config", str(path))
    assert rc == 1 and out == ""
    assert err.startswith(f"nvct: {path}: {message}"), err
    assert err.count("\n") == 1
    assert path.read_text() == content
    assert os.listdir(tmp_path) == [name]


def test_unknown_runtime_is_a_usage_error(capsys):
    rc, _, err = nvct(capsys, "configure", "--runtime", "podman")
    assert rc == 2 and "'podman' is not one of" in err


def test_oci_hook_mode_without_path_prints_the_hook(capsys):
    rc, out, err = nvct(capsys, "configure", "--config-mode", "oci-hook",
                        "--nvidia-runtime-hook-path", "/opt/bin/nvidia-container-runtime-hook")
    assert rc == 0
    hook = json.loads(out)
    assert hook["hook"]["path"] == "/opt/bin/nvidia-container-runtime-hook"
    assert hook["hook"]["args"] == ["nvidia-container-runtime-hook", "prestart"]
    assert "deprecated" in err


def test_oci_hook_mode_writes_and_removes_the_hook_file(tmp_path, capsys):
    hook = tmp_path / "hooks.d" / "oci-nvidia-hook.json"
    assert nvct(capsys, "configure", "--runtime", "crio", "--config-mode", "oci-hook",
                "--oci-hook-path", str(hook))[0] == 0
    assert json.loads(hook.read_text())["stages"] == ["prestart"]
    assert nvct(capsys, "unconfigure", "--config-mode", "oci-hook", "--oci-hook-path", str(hook))[0] == 0
    assert os.listdir(tmp_path) == []


def test_crio_ignores_cdi_and_docker_ignores_command_source(tmp_path, capsys):
    rc, _, err = nvct(capsys, "configure", "--runtime", "crio", "--config", str(tmp_path / "crio.conf"),
                      "--cdi.enabled")
    assert rc == 0 and "ignoring --cdi.enabled for crio" in err
    rc, _, err = nvct(capsys, "configure", "--config", str(tmp_path / "daemon.json"), "--config-source", "command")
    assert rc == 0 and "docker cannot report its config" in err


def test_second_configure_reports_no_changes(tmp_path, capsys):
    path = tmp_path / "daemon.json"
    nvct(capsys, "configure", "--config", str(path))
    rc, _, err = nvct(capsys, "configure", "--config", str(path))
    assert rc == 0 and "no changes" in err


def test_docker_unconfigure_says_to_restart_dockerd(tmp_path, capsys):
    # dockerd keeps its runtimes and default runtime across SIGHUP: a reload would not undo them.
    config = tmp_path / "daemon.json"
    assert nvct(capsys, "configure", "--config", str(config), "--set-as-default")[0] == 0
    rc, _, err = nvct(capsys, "unconfigure", "--config", str(config))
    assert rc == 0, err
    assert err.splitlines()[-1] == (
        "nvct: restart dockerd to apply (a reload keeps the removed runtime and default runtime)")


CONTAINERD_V2 = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "runc"\n'
                 '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
                 'runtime_type = "io.containerd.runc.v2"\n'
                 '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\nSystemdCgroup = false\n')


def test_containerd_unconfigure_removes_the_drop_in_it_created_even_after_it_was_edited(tmp_path, capsys):
    config = tmp_path / "config.toml"
    config.write_text(CONTAINERD_V2)
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    assert nvct(capsys, "configure", "--runtime", "containerd", "--config", str(config))[0] == 0
    drop_in.write_text(drop_in.read_text().replace("SystemdCgroup = false", "SystemdCgroup = true"))
    rc, _, err = nvct(capsys, "unconfigure", "--runtime", "containerd", "--config", str(config))
    assert rc == 0
    cri = "plugins.io.containerd.grpc.v1.cri.containerd.runtimes"
    assert f"nvct: {drop_in}: changed since nvct created it (by someone else: {cri}.runc.options.SystemdCgroup, " \
           f"{cri}.nvidia.options.SystemdCgroup); removed it all the same (nvct's drop-in; keep " \
           f"settings in {config})\n" in err, err
    assert config.read_text() == CONTAINERD_V2
    assert sorted(os.listdir(tmp_path)) == ["config.toml"]  # no drop-in, no conf.d, no backup, no record


def test_no_backup_outlives_unconfigure_and_no_message_calls_nvcts_entry_the_original(tmp_path, capsys):
    """No daemon.json, configure, then --set-as-default, then unconfigure (issue 23)."""
    path = tmp_path / "daemon.json"
    assert nvct(capsys, "configure", "--runtime", "docker", "--config", str(path))[0] == 0
    assert nvct(capsys, "configure", "--runtime", "docker", "--config", str(path), "--set-as-default")[0] == 0
    rc, _, err = nvct(capsys, "unconfigure", "--runtime", "docker", "--config", str(path))
    assert rc == 0 and os.listdir(tmp_path) == []
    assert err == f"nvct: removed {path}\nnvct: restart dockerd to apply (a reload keeps the removed runtime and " \
                  f"default runtime)\n"


def test_unconfigure_says_when_its_changes_go_with_a_later_installers(tmp_path, capsys):
    from nvct import engines as runtimes

    path = tmp_path / "daemon.json"
    assert nvct(capsys, "configure", "--runtime", "docker", "--config", str(path))[0] == 0
    runtimes.configure("docker", str(path), {"nvidia": "/opt/toolkit/nvidia-container-runtime"},
                       set_default="nvidia", owner="nvct toolkit install /opt/toolkit")
    installed = path.read_bytes()
    rc, _, err = nvct(capsys, "unconfigure", "--runtime", "docker", "--config", str(path))
    assert rc == 0 and path.read_bytes() == installed
    assert err == f"nvct: {path}: nvct toolkit install /opt/toolkit changed it after nvct runtime configure did; " \
                  f"the earlier changes are undone with its own\nnvct: no changes now\n"
    runtimes.unconfigure("docker", str(path), owner="nvct toolkit install /opt/toolkit")
    assert os.listdir(tmp_path) == []
