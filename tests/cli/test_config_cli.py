"""``nvct config``: default, show, and --set editing (like ``nvidia-ctk config``)."""

from __future__ import annotations

import os

import pytest

from nvct.cli import main

DEFAULT_TOML = '''\
#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvct]
#dev-root = "/"
#path = "/usr/bin/nvct"
#proc-root = "/proc"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
#ldcache = "/etc/ld.so.cache"
ldconfig = "@/sbin/ldconfig"
load-kmods = true
#no-cgroups = false
#path = "/usr/bin/nvidia-container-cli"
#root = "/run/nvidia/driver"
#user = "root:video"

[nvidia-container-runtime]
#debug = "/var/log/nvidia-container-runtime.log"
log-level = "info"
mode = "auto"
runtimes = ["runc", "crun"]

[nvidia-container-runtime.modes]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime.modes.legacy]
cuda-compat-mode = "ldconfig"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
'''

EXISTING = '''\
# site settings: do not remove
[nvidia-container-runtime]
mode = "cdi"  # GPUs via CDI only
'''


def nvct(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_default_is_the_reference_layout_with_commented_examples(capsys):
    rc, out, _ = nvct(capsys, "config", "default")
    assert rc == 0
    assert out == DEFAULT_TOML


@pytest.mark.parametrize("alias", ["create-default", "generate-default"])
def test_default_has_the_reference_aliases(capsys, alias):
    assert nvct(capsys, "config", alias) == (0, DEFAULT_TOML, "")


def test_default_is_a_valid_config_equal_to_the_defaults(tmp_path, capsys):
    from nvct.config import file as config

    path = tmp_path / "config.toml"
    assert nvct(capsys, "config", "default", "-o", str(path))[0] == 0
    assert path.read_text() == DEFAULT_TOML
    assert config.load(str(path)).data == config.Config().data


def test_show_prints_file_over_defaults(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    rc, out, _ = nvct(capsys, "config", "show", "-c", str(path))
    assert rc == 0
    assert 'mode = "cdi"\n' in out and 'log-level = "info"\n' in out and "#" not in out
    rc, out2, _ = nvct(capsys, "--config", str(path), "config", "show")
    assert out2 == out


def test_set_on_an_existing_file_keeps_comments(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    rc, out, _ = nvct(capsys, "config", "-c", str(path), "--set", "nvidia-container-runtime.mode=legacy",
                      "--set", "features.allow-ldconfig-from-container")
    assert rc == 0
    assert out == '''\
# site settings: do not remove
[nvidia-container-runtime]
mode = "legacy"  # GPUs via CDI only

[features]
allow-ldconfig-from-container = true
'''
    assert path.read_text() == EXISTING


def test_in_place_writes_atomically_with_a_backup(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    rc, out, _ = nvct(capsys, "config", "-c", str(path), "-i", "--set", "disable-require")
    assert rc == 0 and out == ""
    assert path.read_text() == EXISTING.replace("\n[", "\ndisable-require = true\n[", 1)
    assert (tmp_path / "config.toml.nvct.bak").read_text() == EXISTING


def test_set_on_a_missing_file_starts_from_the_default_and_uncomments_what_is_set(tmp_path, capsys):
    path = tmp_path / "new" / "config.toml"
    rc, _, _ = nvct(capsys, "config", "-c", str(path), "-i", "--set", "nvidia-container-cli.root=/run/nvidia/driver",
                    "--set", "nvidia-container-runtime.runtimes=crun:runc")
    assert rc == 0
    text = path.read_text()
    assert '\nroot = "/run/nvidia/driver"\n' in text and "#root" not in text
    assert 'runtimes = ["crun", "runc"]\n' in text
    assert "#user = \"root:video\"\n" in text


def test_output_writes_elsewhere_and_leaves_the_config_alone(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    out_path = tmp_path / "out.toml"
    assert nvct(capsys, "config", "-c", str(path), "-o", str(out_path), "--set", "swarm-resource=x=y")[0] == 0
    assert 'swarm-resource = "x=y"\n' in out_path.read_text()
    assert path.read_text() == EXISTING


@pytest.mark.parametrize("flag,value", [
    ("disable-require=false", False),
    ("disable-require=1", True),
    ("nvidia-container-cli.environment=A=1,B=2", ["A=1", "B=2"]),
    ("nvidia-container-cli.environment=one", ["one"]),
    ("nvidia-container-runtime.modes.cdi.spec-dirs=/etc/cdi:/run/cdi", ["/etc/cdi", "/run/cdi"]),
    ("swarm-resource=5", "5"),
])
def test_set_types_values_by_the_keys_default(flag, value):
    from nvct.cli.config import parse_set

    assert parse_set(flag)[1] == value


def test_features_nil_removes_the_feature(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text("[features]\nallow-ldconfig-from-container = true\n")
    rc, out, _ = nvct(capsys, "config", "-c", str(path), "--set", "features.allow-ldconfig-from-container=nil")
    assert rc == 0 and "allow-ldconfig-from-container" not in out


@pytest.mark.parametrize("flag,message", [
    ("undefined=1", "--set undefined=1: unknown config key 'undefined'"),
    ("nvidia-container-cli.undefined=1", "--set nvidia-container-cli.undefined=1: unknown config key "
                                         "'nvidia-container-cli.undefined'"),
    ("disable-require=something", "--set disable-require=something: 'something' is not a boolean"),
    ("swarm-resource", "--set swarm-resource: expected key=value"),
    ("nvidia-container-cli=x", "--set nvidia-container-cli=x: 'nvidia-container-cli' is a table, not a setting"),
    ("features.bogus=true", "--set features.bogus=true: unknown feature 'bogus'"),
])
def test_bad_set_is_one_line_error(tmp_path, capsys, flag, message):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    rc, out, err = nvct(capsys, "config", "-c", str(path), "-i", "--set", flag)
    assert (rc, out, err) == (1, "", f"nvct: {message}\n")
    assert os.listdir(tmp_path) == ["config.toml"] and path.read_text() == EXISTING


def test_invalid_result_is_refused(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    rc, _, err = nvct(capsys, "config", "-c", str(path), "-i", "--set", "nvidia-container-runtime.mode=bogus")
    assert rc == 1 and "unknown mode 'bogus'" in err
    assert path.read_text() == EXISTING


def test_invalid_file_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text("[nvidia-container-runtime\n")
    rc, _, err = nvct(capsys, "config", "-c", str(path), "--set", "disable-require")
    assert rc == 1 and err.startswith(f"nvct: {path}: invalid TOML: line 1, column ") and err.count("\n") == 1


def test_in_place_and_output_together_is_an_error(tmp_path, capsys):
    rc, _, err = nvct(capsys, "config", "-c", str(tmp_path / "c.toml"), "-i", "-o", str(tmp_path / "o.toml"))
    assert rc == 1 and err == "nvct: cannot use both --in-place and --output\n"


def test_a_typo_in_a_key_is_warned_about_on_stderr_and_the_config_still_works(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "config.toml"
    path.write_text('[nvidia-container-runtime]\nmod = "legacy"\n')
    nvct_bin = os.path.join(os.path.dirname(sys.executable), "nvct")
    warning = (f"nvct: warning: {path}: unknown key 'nvidia-container-runtime.mod' ignored "
               "(a typo? 'nvct config default' lists every key)\n")
    for args in (["config", "show", "-c", str(path)], ["config", "-c", str(path)],
                 ["config", "-c", str(path), "--set", "nvidia-container-runtime.mode=cdi", "-i"]):
        proc = subprocess.run([nvct_bin, *args], capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (0, warning), args
    assert path.read_text() == '[nvidia-container-runtime]\nmod = "legacy"\nmode = "cdi"\n'
