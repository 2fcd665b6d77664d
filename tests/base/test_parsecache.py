from __future__ import annotations

import datetime
import os

import pytest

from nvct.base import parsecache

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cache is used by root only")


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(parsecache, "ROOT", str(tmp_path / "nvct"))
    return tmp_path / "nvct"


def _counting(result):
    calls = []

    def parse(raw):
        calls.append(raw)
        return result(raw) if callable(result) else result
    return parse, calls


def test_same_bytes_are_parsed_once_across_calls(root):
    parse, calls = _counting(lambda raw: {"n": len(raw)})
    assert parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse) == {"n": 3}
    assert parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse) == {"n": 3}
    assert calls == [b"abc"]
    assert oct((root / "t-cache").stat().st_mode & 0o777) == "0o700"


def test_changed_bytes_are_parsed_again_even_with_the_same_size(root):
    parse, calls = _counting(lambda raw: raw.decode())
    parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse)
    assert parsecache.parse_cached(b"abd", "/etc/x.yaml", "t", parse) == "abd"
    assert calls == [b"abc", b"abd"]


def test_a_directory_others_can_write_is_not_used(root):
    (root / "t-cache").mkdir(parents=True, mode=0o700)
    os.chmod(root / "t-cache", 0o733)
    parse, calls = _counting({"a": 1})
    parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse)
    parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse)
    assert len(calls) == 2 and os.listdir(root / "t-cache") == []


def test_a_symlinked_cache_directory_is_not_used(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.mkdir()
    (root / "t-cache").symlink_to(elsewhere)
    parse, calls = _counting({"a": 1})
    parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse)
    assert os.listdir(elsewhere) == []


def test_a_value_marshal_cannot_hold_is_returned_and_not_cached(root):
    when = datetime.date(2024, 1, 1)
    parse, calls = _counting({"d": when})
    assert parsecache.parse_cached(b"d", "/etc/x.toml", "t", parse) == {"d": when}
    assert os.listdir(root / "t-cache") == []


def test_a_corrupt_entry_is_parsed_again(root):
    parse, calls = _counting([1, 2])
    parsecache.parse_cached(b"x", "/etc/x.yaml", "t", parse)
    (entry,) = (root / "t-cache").iterdir()
    entry.write_bytes(b"\x00garbage")
    assert parsecache.parse_cached(b"x", "/etc/x.yaml", "t", parse) == [1, 2]
    assert len(calls) == 2


def test_parse_errors_propagate_and_leave_no_entry(root):
    def parse(raw):
        raise ValueError("bad")
    with pytest.raises(ValueError):
        parsecache.parse_cached(b"x", "/etc/x.yaml", "t", parse)
    assert os.listdir(root / "t-cache") == []


def test_entries_of_files_that_came_and_went_do_not_pile_up(root, monkeypatch):
    """One spec per DRA claim: a busy node sees endless paths; /run is memory."""
    monkeypatch.setattr(parsecache, "MAX_ENTRIES", 8)
    for n in range(30):
        parsecache.parse_cached(b"x", f"/var/run/cdi/claim-{n}.json", "t", lambda raw, n=n: n)
    names = os.listdir(root / "t-cache")
    assert len(names) <= 8
    assert "%var%run%cdi%claim-29.json.marshal" in names  # the newest stays
    parse, calls = _counting(0)
    parsecache.parse_cached(b"x", "/var/run/cdi/claim-29.json", "t", parse)
    assert calls == []


def test_a_symlinked_run_nvct_is_not_used_nor_written_through(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.symlink_to(elsewhere)
    parse, calls = _counting({"a": 1})
    assert parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse) == {"a": 1}
    assert parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", parse) == {"a": 1}
    assert len(calls) == 2 and os.listdir(elsewhere) == []


def test_a_stale_temporary_of_a_killed_writer_is_swept_by_the_next_write(root):
    import subprocess

    parsecache.parse_cached(b"abc", "/etc/x.yaml", "t", lambda raw: 1)
    p = subprocess.Popen(["true"])
    p.wait()
    (root / "t-cache" / f"%etc%x.yaml.marshal.{p.pid}.tmp").write_bytes(b"")  # an older writer's name
    (root / "t-cache" / f".nvct-{p.pid}-00000000.tmp").write_bytes(b"")
    parsecache.parse_cached(b"abd", "/etc/x.yaml", "t", lambda raw: 2)
    assert os.listdir(root / "t-cache") == ["%etc%x.yaml.marshal"]


def test_a_kept_config_is_found_by_its_digest_only_while_it_holds_those_bytes(root):
    digest = parsecache.keep(b"[nvidia-container-runtime]\nmode = 'legacy'\n")
    assert digest == parsecache.digest(b"[nvidia-container-runtime]\nmode = 'legacy'\n")
    assert parsecache.kept(digest) == b"[nvidia-container-runtime]\nmode = 'legacy'\n"
    assert oct((root / "config-kept").stat().st_mode & 0o777) == "0o700"
    (root / "config-kept" / digest).write_bytes(b"[changed]\n")
    assert parsecache.kept(digest) is None
    assert parsecache.kept("../" + digest) is None and parsecache.kept("") is None


def test_kept_configs_are_trimmed_to_the_newest(root, monkeypatch):
    monkeypatch.setattr(parsecache, "MAX_ENTRIES", 8)
    names = [parsecache.keep(b"n = %d\n" % i) for i in range(8)]
    for i, name in enumerate(names):
        os.utime(root / "config-kept" / name, ns=(i, i))
    parsecache.keep(b"n = 8\n")  # 8 others: the newest half stays
    assert sorted(os.listdir(root / "config-kept")) == sorted([*names[4:], parsecache.digest(b"n = 8\n")])
