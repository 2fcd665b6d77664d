"""The record the sh fronts read in /run/nvct: content identities, names, no link followed or deleted through."""

import os
import subprocess
import sys
import time

import pytest

from tests.support.fixtures import need_root
from tests.support.legacy_front import age

HOOK = '{"path":"/usr/bin/nvidia-container-runtime-hook","env":["PATH=/bin","it\'s"]}'
NAMES = ["\\", "NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "/var/run/nvidia-container-devices", "cdi.k8s.io/"]


def _cache_in(tmp_path, monkeypatch, mode=0o700, name="nvct"):
    from nvct.oci import runtime as lowlevel

    directory = tmp_path / name
    if not directory.exists():
        directory.mkdir()
    directory.chmod(mode)
    monkeypatch.setattr(lowlevel, "CACHE_DIR", str(directory))
    monkeypatch.setattr(lowlevel, "CACHE", str(directory / "runtimes"))
    monkeypatch.setattr(lowlevel, "HOOKS", str(directory / "legacy-hooks"))
    monkeypatch.setattr(lowlevel, "NAMES", str(directory / "names"))
    return lowlevel, directory / "runtimes"


def _config(tmp_path, text="", name="config.toml"):
    config = tmp_path / name
    config.write_text(text)
    age(str(config))
    return str(config)


def _line(cache, key):
    [line] = [line for line in cache.read_text().splitlines() if line.startswith(key + "\t")]
    return line.split("\t")


def _stat(path):
    from nvct.oci import runtime as lowlevel

    return subprocess.run(["stat", "-L", "-c", lowlevel.IDENTITY_FORMAT, "--", path],
                          capture_output=True, text=True, check=True).stdout.rstrip("\n")


def _trusted(lowlevel, config):
    """The config's identity, once its ctime is old enough (age() moved only its mtime)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # a tick of the clock that stamps files: ~10 ms
        seen = lowlevel.identity(config)
        if seen:
            return seen
    raise AssertionError("identity never trusted")


def test_the_identity_is_what_stat_prints_and_moves_with_a_copy_that_keeps_the_mtime(tmp_path):
    from nvct.oci import runtime as lowlevel

    config = _config(tmp_path, 'x = "runc"\n')
    seen = _trusted(lowlevel, config)
    assert seen == _stat(config)
    other = _config(tmp_path, 'x = "crun"\n', "other.toml")  # same size
    os.utime(other, ns=(os.stat(config).st_atime_ns, os.stat(config).st_mtime_ns))
    subprocess.run(["cp", "-p", other, config], check=True)  # in place: same inode, same mtime
    assert os.stat(config).st_mtime_ns == int(seen.split(":")[3].replace(".", ""))
    assert _stat(config) != seen
    assert lowlevel.identity(str(tmp_path / "missing.toml")) is None


def test_a_config_changed_just_now_is_not_trusted(tmp_path):
    from nvct.oci import runtime as lowlevel

    config = tmp_path / "config.toml"
    config.write_text("")  # another write within the clock's tick could keep its whole identity
    assert lowlevel.identity(str(config)) is False


def test_the_record_names_the_identity_the_runtime_and_a_root_only_names_file(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    config = _config(tmp_path)
    seen = _trusted(lowlevel, config)
    assert lowlevel.remember(config, seen, NAMES, "/usr/sbin/runc") is None
    key, runtime, ident, hooks, names = _line(cache, config)
    assert (runtime, ident, hooks) == ("/usr/sbin/runc", _stat(config), "-")
    path = tmp_path / "nvct" / "names" / names
    assert path.read_text() == "".join(f"{n}\n" for n in NAMES)
    for p, mode in ((path, 0o600), (path.parent, 0o700), (cache, 0o600)):
        st = os.lstat(p)
        assert (st.st_uid, st.st_mode & 0o777) == (0, mode), p
    assert lowlevel.last_known(config) == "/usr/sbin/runc"
    assert lowlevel.remember(config, False, NAMES, "/usr/sbin/runc") is None  # untrusted now
    assert _line(cache, config)[2] == "!"


def test_a_busy_cache_keeps_the_latest_lines_first(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    for n in range(70):
        lowlevel.remember(f"/etc/{n}.toml", None, NAMES, "/usr/sbin/runc")
    keys = [line.split("\t")[0] for line in cache.read_text().splitlines()]
    assert keys == [f"/etc/{n}.toml" for n in range(69, 5, -1)]
    lowlevel.remember("/etc/10.toml", None, NAMES, "/usr/bin/crun")
    assert cache.read_text().splitlines()[0].split("\t")[:2] == ["/etc/10.toml", "/usr/bin/crun"]


def test_names_a_line_cannot_hold_become_the_line_that_matches_every_spec(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    lowlevel.remember("/etc/a.toml", None, ["X", "a\nb", "c\0"], "/usr/sbin/runc")
    names = _line(cache, "/etc/a.toml")[4]
    assert (tmp_path / "nvct" / "names" / names).read_text() == "X\n\n\n"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_cache_in_a_directory_others_may_write_is_removed_not_used(tmp_path, monkeypatch, mode):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch, mode)
    cache.write_text("/etc/config.toml\t/tmp/evil\t-\t-\t-\n")
    assert "not used" in lowlevel.remember("/etc/config.toml", None, NAMES, "/usr/sbin/runc")
    assert not cache.exists()
    assert lowlevel.last_known("/etc/config.toml") is None


def test_a_symlinked_run_nvct_is_neither_used_nor_deleted_through(tmp_path, monkeypatch):
    """The link's target keeps its files: nothing is written, read or removed through a link."""
    need_root("the record is root-only")
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o777)
    (target / "runtimes").write_text("/etc/config.toml\t/tmp/evil\t-\t-\t-\n")
    (tmp_path / "nvct").symlink_to(target)
    lowlevel, _ = _cache_in(tmp_path, monkeypatch, 0o777)
    target.chmod(0o777)
    assert "not used" in lowlevel.remember("/etc/config.toml", None, NAMES, "/usr/sbin/runc")
    assert sorted(os.listdir(target)) == ["runtimes"]
    assert lowlevel.last_known("/etc/config.toml") is None
    target.chmod(0o700)  # even a private target is not followed
    assert lowlevel.remember("/etc/config.toml", None, NAMES, "/usr/sbin/runc")
    assert lowlevel.last_known("/etc/config.toml") is None
    assert sorted(os.listdir(target)) == ["runtimes"]


@pytest.mark.parametrize("sub", ["names", "legacy-hooks"])
def test_a_symlinked_folder_under_run_nvct_is_not_followed(tmp_path, monkeypatch, sub):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "nvct" / sub).symlink_to(elsewhere)
    legacy = ("/usr/bin/nvidia-container-runtime", {"hook": HOOK})
    problem = lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc", legacy)
    assert problem and sub in problem
    assert os.listdir(elsewhere) == [] and not cache.exists()


def test_legacy_mode_records_the_program_and_its_hook_in_a_file_of_their_own(tmp_path, monkeypatch):
    """As sh assignments the front sources: it parses nothing."""
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    hooks_dir = tmp_path / "nvct" / "legacy-hooks"
    legacy = {"hook": HOOK, "hook_path": "/usr/bin/it's"}
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc", ("/usr/bin/nvidia-container-runtime", legacy))
    lowlevel.remember("/etc/b.toml", None, NAMES, "/usr/bin/crun")
    b, a = cache.read_text().splitlines()  # the latest first
    assert b.split("\t")[:4] == ["/etc/b.toml", "/usr/bin/crun", "-", "-"]  # no hook to insert
    key, runtime, mark, hooks, names = a.split("\t")
    assert (key, runtime, mark) == ("/etc/a.toml", "/usr/sbin/runc", "-")
    assert _sourced(hooks_dir / hooks, "nvct_program", "nvct_hook", "nvct_hook_path") == [
        "/usr/bin/nvidia-container-runtime", HOOK, "/usr/bin/it's"]
    assert os.lstat(hooks_dir / hooks).st_mode & 0o777 == 0o600 and os.lstat(hooks_dir).st_mode & 0o777 == 0o700
    assert lowlevel.last_known("/etc/a.toml") == "/usr/sbin/runc"
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc",
                      ("/usr/bin/nvidia-container-runtime.legacy", legacy))
    other = _line(cache, "/etc/a.toml")[3]  # another program: another file
    assert _sourced(hooks_dir / other, "nvct_program") == ["/usr/bin/nvidia-container-runtime.legacy"]
    assert other != hooks
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc")  # the mode changed: the hook goes
    assert _line(cache, "/etc/a.toml")[3] == "-"


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash --posix"])
def test_the_fronts_record_sourced_by_sh_gives_each_config_its_runtime_identity_and_files(
        tmp_path, monkeypatch, shell):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    odd = str(tmp_path / "it's a $(config) *.toml")
    lowlevel.remember(odd, "1:2:3:4.000000001:5.000000001", NAMES, "/opt/run 'c'")
    lowlevel.remember("/etc/absent.toml", None, NAMES, "/usr/sbin/runc")
    lowlevel.remember("/etc/fresh.toml", False, NAMES, "/usr/sbin/runc")  # untrusted: no arm
    fronts = tmp_path / "nvct" / "fronts"
    names = str(tmp_path / "nvct" / "names" / _line(cache, odd)[4])
    wanted = ("nvct_stat", "nvct_ident", "nvct_absent", "nvct_runtime", "nvct_hooks", "nvct_names")
    assert _sourced(fronts, *wanted, config=odd, shell=shell) == [
        lowlevel.IDENTITY_FORMAT, "1:2:3:4.000000001:5.000000001", "", "/opt/run 'c'", "", names]
    assert _sourced(fronts, *wanted, config="/etc/absent.toml", shell=shell)[2:4] == ["1", "/usr/sbin/runc"]
    for config in ("/etc/fresh.toml", "/etc/*.toml", str(tmp_path / "*")):
        assert _sourced(fronts, *wanted, config=config, shell=shell)[1:] == [""] * 5


def test_an_older_nvcts_cache_gets_the_fronts_record_with_the_next_call(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc")
    (tmp_path / "nvct" / "fronts").unlink()  # as an older nvct left /run/nvct
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc")
    assert _sourced(tmp_path / "nvct" / "fronts", "nvct_runtime", config="/etc/a.toml") == ["/usr/sbin/runc"]
    # a record in an older format (its fronts set no $config): rewritten, though the entry is the same
    older = (tmp_path / "nvct" / "fronts").read_text().replace("config=", "nvct_older=")
    (tmp_path / "nvct" / "fronts").write_text(older)
    assert _sourced(tmp_path / "nvct" / "fronts", "nvct_runtime", config="/etc/a.toml") == [""]
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc")
    assert _sourced(tmp_path / "nvct" / "fronts", "nvct_runtime", config="/etc/a.toml") == ["/usr/sbin/runc"]


def _sourced(path, *names, config="", shell="/bin/sh"):
    """The values of ``names`` after sh sources ``path`` as a front does, for the config file
    ``config`` (the record finds its path as nvct.config.file does), one a line."""
    script = r'. "$1" && shift && for n do eval "v=\${$n-}"; printf "%s\n" "$v"; done'
    out = subprocess.run([*shell.split(), "-c", script, "sh", str(path), *names],
                         env={"NVIDIA_CTK_CONFIG_FILE_PATH": config}, capture_output=True, text=True, check=True).stdout
    return out.split("\n")[:-1]


def test_the_hook_records_names_and_keeps_the_shims_runtime_only_for_the_same_config(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    lowlevel.remember("/etc/a.toml", "1:2:3:4.000000001:5.000000001", NAMES, "/usr/sbin/runc",
                      ("/usr/bin/nvidia-container-runtime", {"hook": HOOK}))
    shims = _line(cache, "/etc/a.toml")
    lowlevel.remember("/etc/a.toml", "1:2:3:4.000000001:5.000000001", NAMES)
    assert _line(cache, "/etc/a.toml") == shims
    lowlevel.remember("/etc/a.toml", "1:2:3:4.000000001:5.000000001", [*NAMES, "Y/"])  # rewritten, locked
    assert _line(cache, "/etc/a.toml")[:4] == shims[:4]
    lowlevel.remember("/etc/a.toml", "1:2:3:4.000000001:6.000000001", [*NAMES, "X/"])  # changed since
    key, runtime, mark, hooks, names = _line(cache, "/etc/a.toml")
    assert (runtime, mark, hooks) == ("-", "1:2:3:4.000000001:6.000000001", "-")
    assert (tmp_path / "nvct" / "names" / names).read_text().endswith("cdi.k8s.io/\nX/\n")
    assert lowlevel.last_known("/etc/a.toml") is None


def test_a_full_run_nvct_is_said_once_and_leaves_no_temporary_file(tmp_path):
    """A tmpfs with no room left, in a private mount namespace: remember() says why, in a line the
    shim logs at debug level, and the directory holds exactly what it held before."""
    need_root("mounts a tmpfs in a private mount namespace")
    run = tmp_path / "run"
    run.mkdir()
    code = f"""
import os, sys
from nvct.oci import runtime as lowlevel; from nvct.base import parsecache
d = {str(run / 'nvct')!r}
lowlevel.CACHE_DIR, lowlevel.CACHE = d, d + "/runtimes"
lowlevel.NAMES, lowlevel.HOOKS = d + "/names", d + "/legacy-hooks"
parsecache.ROOT = d
os.makedirs(d + "/names", mode=0o700)
os.makedirs(d + "/config-cache", mode=0o700)
fill = os.open(d + "/fill", os.O_WRONLY | os.O_CREAT, 0o600)
try:
    while True:
        os.write(fill, b"x" * 4096)
except OSError:
    pass
for n in range(3):
    print(lowlevel.remember(f"/etc/{{n}}.toml", None, {NAMES!r}, "/usr/sbin/runc"))
print(parsecache.parse_cached(b"abc", "/etc/x.toml", "config", lambda raw: 1), parsecache.problems)
print(sorted(f for top, dirs, files in os.walk(d) for f in files))
"""
    script = 'mount -t tmpfs -o size=64k,mode=0700 nvct-test "$0" && exec "$@"'
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(run),
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all("No space left on device" in line for line in lines[:3]), lines
    assert lines[3].startswith("1 [") and "config-cache/%etc%x.toml.marshal: not written: No space left" in lines[3]
    assert lines[4] == "['fill']"  # nothing else, under any name


def test_an_older_nvcts_stamps_go_with_the_next_write(tmp_path, monkeypatch):
    need_root("the record is root-only")
    lowlevel, cache = _cache_in(tmp_path, monkeypatch)
    stamps = tmp_path / "nvct" / "stamps"
    stamps.mkdir(mode=0o700)
    (stamps / "0123abcd").write_text("")
    cache.write_text("/etc/a.toml\t/usr/sbin/runc\t/run/nvct/stamps/0123abcd\n")  # an older line: not used
    lowlevel.remember("/etc/a.toml", None, NAMES, "/usr/sbin/runc")
    assert not stamps.exists()
    assert [line.split("\t")[:3] for line in cache.read_text().splitlines()] == [["/etc/a.toml", "/usr/sbin/runc", "-"]]
