"""The low-level runtime cache the sh front reads: stamps, untrusted lines, unsafe directories."""

import os

import pytest

from tests.support.fixtures import need_root


def _cache_in(tmp_path, monkeypatch, mode):
    from nvct import lowlevel

    directory = tmp_path / "nvct"
    directory.mkdir()
    directory.chmod(mode)
    monkeypatch.setattr(lowlevel, "CACHE_DIR", str(directory))
    monkeypatch.setattr(lowlevel, "CACHE", str(directory / "runtimes"))
    monkeypatch.setattr(lowlevel, "STAMPS", str(directory / "stamps"))
    return lowlevel, directory / "runtimes"


def test_the_runtime_cache_records_the_config_mtime_in_a_root_only_stamp(tmp_path, monkeypatch):
    need_root("the runtime cache is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch, 0o700)
    config = tmp_path / "config.toml"
    config.write_text("")
    os.utime(config, ns=(10**18, 10**18))
    lowlevel.remember(str(config), "/usr/sbin/runc", lowlevel.stamp(str(config)))
    [line] = cache.read_text().splitlines()
    key, runtime, stamp = line.split("\t")
    assert (key, runtime) == (str(config), "/usr/sbin/runc")
    st = os.lstat(stamp)
    assert st.st_mtime_ns == 10**18 and st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    assert lowlevel.last_known(str(config)) == "/usr/sbin/runc"


def test_a_config_written_just_now_is_recorded_untrusted(tmp_path, monkeypatch):
    need_root("the runtime cache is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch, 0o700)
    config = tmp_path / "config.toml"
    config.write_text("")  # its mtime may still change within the clock's granularity
    lowlevel.remember(str(config), "/usr/sbin/runc", lowlevel.stamp(str(config)))
    assert cache.read_text() == f"{config}\t/usr/sbin/runc\t!\n"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_cache_in_a_directory_others_may_write_is_removed_not_used(tmp_path, monkeypatch, mode):
    need_root("the runtime cache is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch, mode)
    cache.write_text("/etc/config.toml\t/tmp/evil\t-\n")
    lowlevel.remember("/etc/config.toml", "/usr/sbin/runc", None)
    assert not cache.exists()
    assert lowlevel.last_known("/etc/config.toml") is None


def test_legacy_mode_records_the_program_and_its_hook_in_a_file_of_their_own(tmp_path, monkeypatch):
    """The sh front reads the cache a byte per system call: the line stays short."""
    need_root("the runtime cache is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch, 0o700)
    monkeypatch.setattr(lowlevel, "HOOKS", str(tmp_path / "nvct" / "legacy-hooks"))
    hook = '{"path":"/usr/bin/nvidia-container-runtime-hook","env":["PATH=/bin"'
    lowlevel.remember("/etc/a.toml", "/usr/sbin/runc", None, ("/usr/bin/nvidia-container-runtime", hook))
    lowlevel.remember("/etc/b.toml", "/usr/bin/crun", None)
    a, b = cache.read_text().splitlines()
    assert b == "/etc/b.toml\t/usr/bin/crun\t-"  # three fields as before: no hook to insert
    key, runtime, mark, hooks = a.split("\t")
    assert (key, runtime, mark) == ("/etc/a.toml", "/usr/sbin/runc", "-")
    assert open(hooks).read() == f"/usr/bin/nvidia-container-runtime\n{hook}\n"
    assert os.lstat(hooks).st_mode & 0o777 == 0o600 and os.lstat(os.path.dirname(hooks)).st_mode & 0o777 == 0o700
    assert lowlevel.last_known("/etc/a.toml") == "/usr/sbin/runc"
    lowlevel.remember("/etc/a.toml", "/usr/sbin/runc", None, ("/usr/bin/nvidia-container-runtime.legacy", hook))
    other = cache.read_text().splitlines()[0].split("\t")[3]  # another program: another file, the old one gone
    assert open(other).read().startswith("/usr/bin/nvidia-container-runtime.legacy\n")
    assert other != hooks and not os.path.exists(hooks)
    lowlevel.remember("/etc/a.toml", "/usr/sbin/runc", None)  # the mode changed: the hook goes
    assert cache.read_text().splitlines()[0] == "/etc/a.toml\t/usr/sbin/runc\t-"
    assert os.listdir(os.path.dirname(hooks)) == []
