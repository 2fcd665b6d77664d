"""packaging/normalize-config: the packages' post-install config normalization."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from nvct.config import file as config
from tests.packaging.pkgtest import BUILD_ENV, REPO
from tests.support.proc import run

SCRIPT = REPO / "packaging" / "normalize-config"
SHIPPED = REPO / "config" / "config.toml"

USER_EDITED = SHIPPED.read_text().replace(
    'log-level = "info"', '# more detail while we debug node 7\nlog-level = "debug"').replace(
    '#root = "/run/nvidia/driver"', 'root = "/run/nvidia/driver"')


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "etc" / "nvidia-container-runtime"
    d.mkdir(parents=True)
    return d


@pytest.fixture
def this_nvct(tmp_path: Path) -> Path:
    """An ``nvct`` that runs this tree's code (what the package installs)."""
    exe = tmp_path / "bin" / "nvct"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" '
                   f'-c "import sys, nvct.cli; sys.exit(nvct.cli.main())" "$@"\n')
    exe.chmod(0o755)
    return exe


def fake_nvct(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "fake-nvct"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return exe


def normalize(conf: Path, nvct: Path):
    return run(["sh", str(SCRIPT), str(conf), str(nvct)], env=BUILD_ENV, timeout=60)


def settings(path: Path) -> dict:
    return config.Config(config.parse_toml(path.read_bytes(), str(path)), str(path), env={}).data


def test_an_untouched_config_is_not_rewritten(conf_dir, this_nvct):
    conf = conf_dir / "config.toml"
    shutil.copy2(SHIPPED, conf)
    before = os.stat(conf)
    result = normalize(conf, this_nvct)
    assert result.ok and result.stderr == "", result.describe()
    after = os.stat(conf)
    assert conf.read_bytes() == SHIPPED.read_bytes()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(conf_dir)) == ["config.toml"]


def test_user_edits_survive(conf_dir, this_nvct):
    conf = conf_dir / "config.toml"
    conf.write_text(USER_EDITED)
    wanted = settings(conf)
    assert wanted["nvidia-container-runtime"]["log-level"] == "debug"
    result = normalize(conf, this_nvct)
    assert result.ok and result.stderr == "", result.describe()
    assert settings(conf) == wanted
    assert "# more detail while we debug node 7" in conf.read_text()
    assert sorted(os.listdir(conf_dir)) == ["config.toml"]


def test_a_broken_config_is_left_as_it_was_and_the_install_goes_on(conf_dir, this_nvct):
    conf = conf_dir / "config.toml"
    conf.write_text('[nvidia-container-runtime]\nmode = "auto\n')
    result = normalize(conf, this_nvct)
    assert result.rc == 0
    assert "could not normalize" in result.stderr and str(conf) in result.stderr
    assert conf.read_text() == '[nvidia-container-runtime]\nmode = "auto\n'
    assert sorted(os.listdir(conf_dir)) == ["config.toml"]


def test_a_changed_config_replaces_the_file_keeping_its_mode(conf_dir, tmp_path):
    conf = conf_dir / "config.toml"
    conf.write_text(USER_EDITED)
    conf.chmod(0o600)
    # An nvct whose normalization changes the file and leaves a backup beside it.
    nvct = fake_nvct(tmp_path,
                     'case "$*" in *--help*) echo "  -i, --in-place"; exit 0;; esac\n'
                     'cp "$NVIDIA_CTK_CONFIG_FILE_PATH" "$NVIDIA_CTK_CONFIG_FILE_PATH.nvct.bak"\n'
                     'echo "disable-require = true" >> "$NVIDIA_CTK_CONFIG_FILE_PATH"\n')
    result = normalize(conf, nvct)
    assert result.ok, result.describe()
    assert conf.read_text() == USER_EDITED + "disable-require = true\n"
    assert stat.S_IMODE(os.stat(conf).st_mode) == 0o600
    assert sorted(os.listdir(conf_dir)) == ["config.toml"]


@pytest.mark.parametrize("body", [
    'echo "Usage: nvct [OPTIONS] COMMAND"; exit 0\n',   # no `config --in-place` yet
    'echo "Error: No such command config." >&2; exit 2\n',
])
def test_an_nvct_without_config_in_place_changes_nothing(conf_dir, tmp_path, body):
    conf = conf_dir / "config.toml"
    conf.write_text(USER_EDITED)
    result = normalize(conf, fake_nvct(tmp_path, body))
    assert result.ok and result.stderr == "", result.describe()
    assert conf.read_text() == USER_EDITED
    assert sorted(os.listdir(conf_dir)) == ["config.toml"]


def test_a_missing_config_or_a_symlinked_one_is_left_alone(conf_dir, this_nvct, tmp_path):
    missing = conf_dir / "config.toml"
    assert normalize(missing, this_nvct).ok
    assert not missing.exists()
    target = tmp_path / "elsewhere.toml"
    target.write_text(USER_EDITED)
    missing.symlink_to(target)
    assert normalize(missing, this_nvct).ok
    assert missing.is_symlink() and target.read_text() == USER_EDITED
