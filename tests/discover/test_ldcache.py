from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.base.errors import CacheError
from nvct.discover import ldcache
from nvct.discover.ldcache import Entry
from tests.support.fixtures import skip

NATIVE = "<" if sys.byteorder == "little" else ">"
X86_64 = 0x0303  # FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
I386 = 0x0003  # FLAG_ELF_LIBC6
NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0\0"


# --- byte builders for handcrafted caches ------------------------------------


def _string_table(entries, base):
    """Lay out each key and value once; return (blob, [(flags, koff, voff, ...)])."""
    blob = bytearray()
    where = {}
    for text in [t for e in entries for t in (e[1], e[2])]:
        if text not in where:
            where[text] = len(blob)
            blob += text.encode() + b"\0"
    rows = [(e[0], base + where[e[1]], base + where[e[2]]) + tuple(e[3:]) for e in entries]
    return bytes(blob), rows


def new_cache(entries, order="<", endian_flag=2):
    """entries: (flags, key, value[, osversion, hwcap]); offsets from header start."""
    entries = [tuple(e) + (0, 0)[: 5 - len(e)] for e in entries]
    table = 48 + 24 * len(entries)
    blob, rows = _string_table(entries, table)
    header = NEW_MAGIC + struct.pack(order + "IIB3xI12x", len(entries), len(blob), endian_flag, 0)
    body = b"".join(struct.pack(order + "iIIIQ", *row) for row in rows)
    return header + body + blob


def old_cache(entries, *, embedded: bytes = b"", align=8):
    """entries: (flags, key, value); offsets from the end of the entry table."""
    blob, rows = _string_table(entries, 0)
    head = OLD_MAGIC + struct.pack(NATIVE + "I", len(entries))
    head += b"".join(struct.pack(NATIVE + "iII", *row) for row in rows)
    if embedded:
        return head + b"\0" * (-len(head) % align) + embedded
    return head + blob


SAMPLE = [
    (X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    (I386, "libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
    (0x0A03, "libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"),
]


def _keys_values(entries):
    return [(e.flags, e.key, e.value) for e in entries]


# --- handcrafted formats ------------------------------------------------------


def test_new_format_entries_in_file_order():
    got = ldcache.parse(new_cache(SAMPLE))
    assert _keys_values(got) == SAMPLE
    assert [e.arch for e in got] == ["x86_64", "i386", "aarch64"]


def test_new_format_keeps_osversion_and_hwcap():
    hwcap = (1 << 62) | 3
    (entry,) = ldcache.parse(new_cache([(X86_64, "libm.so.6", "/lib/libm.so.6", 7, hwcap)]))
    assert entry == Entry("libm.so.6", "/lib/libm.so.6", X86_64, 7, hwcap)


def test_new_format_big_endian_flag_is_honoured():
    got = ldcache.parse(new_cache(SAMPLE, order=">", endian_flag=3))
    assert _keys_values(got) == SAMPLE


def test_new_format_without_endian_flag_is_native():
    got = ldcache.parse(new_cache(SAMPLE, order=NATIVE, endian_flag=0))
    assert _keys_values(got) == SAMPLE


def test_new_format_invalid_endian_flag_is_rejected():
    with pytest.raises(CacheError, match="byte-order"):
        ldcache.parse(new_cache(SAMPLE, endian_flag=1))


def test_old_format_strings_count_from_end_of_table():
    got = ldcache.parse(old_cache(SAMPLE))
    assert _keys_values(got) == SAMPLE
    assert all(e.osversion == 0 and e.hwcap == 0 for e in got)


@pytest.mark.parametrize("align", [8, 4])
def test_old_format_prefers_embedded_new_cache(align):
    stale = [(X86_64, "libstale.so.1", "/old/libstale.so.1")]
    data = old_cache(stale * 3, embedded=new_cache(SAMPLE), align=align)
    assert _keys_values(ldcache.parse(data)) == SAMPLE


def test_empty_caches_have_no_entries():
    assert ldcache.parse(new_cache([])) == []
    assert ldcache.parse(old_cache([])) == []


def test_non_utf8_paths_do_not_raise():
    data = new_cache([(X86_64, "libx.so", "/lib/x")]).replace(b"/lib/x", b"/lib/\xff")
    (entry,) = ldcache.parse(data)
    assert os.fsencode(entry.value) == b"/lib/\xff"


@pytest.mark.parametrize(
    "flags, arch",
    [
        (0x0303, "x86_64"),
        (0x0003, "i386"),
        (0x0001, "i386"),  # plain ELF: a 32-bit library without a libc dependency
        (0x0803, "x32"),
        (0x0A03, "aarch64"),
        (0x0903, "armhf"),
        (0x0503, "ppc64"),
        (0x0000, "unknown"),  # libc4 a.out
        (0x7F03, "unknown"),
        (-1, "unknown"),
    ],
)
def test_arch_from_flags(flags, arch):
    assert Entry("k", "v", flags).arch == arch


# --- errors -------------------------------------------------------------------


def _error(data, source="ld.so.cache"):
    with pytest.raises(CacheError) as info:
        ldcache.parse(data, source=source)
    message = str(info.value)
    assert "\n" not in message and message.startswith(source + ": ")
    return message


def test_bad_magic():
    assert "bad magic" in _error(b"\x7fELF" + b"\0" * 100, source="/x/ld.so.cache")


@pytest.mark.parametrize("data", [OLD_MAGIC + b"\1\0", NEW_MAGIC + b"\0" * 27])
def test_truncated_header(data):
    assert "truncated header" in _error(data)


def test_entry_table_past_end():
    data = new_cache(SAMPLE)
    assert "entry table past end" in _error(data[: 48 + 24 * 2])


@pytest.mark.parametrize("build", [new_cache, old_cache])
def test_absurd_count_fails_fast(build):
    data = bytearray(build(SAMPLE))
    struct.pack_into(NATIVE + "I", data, 20 if build is new_cache else 12, 0xFFFFFFFF)
    assert "4294967295 entries" in _error(bytes(data))


def test_string_offset_out_of_range():
    data = bytearray(new_cache(SAMPLE))
    struct.pack_into("<I", data, 48 + 8, 0x7FFFFFF0)  # first entry's value
    assert "string offset 2147483632 out of range" in _error(bytes(data))


def test_unterminated_string():
    data = new_cache(SAMPLE)
    assert "unterminated string" in _error(data[:-1])


def test_string_longer_than_path_max_is_unterminated():
    data = new_cache([(X86_64, "libx.so", "/" + "a" * 5000)])
    assert "unterminated string" in _error(data)


def test_overlapping_strings_cannot_amplify_memory():
    assert "overlap" in _error(overlapping_cache())  # and within 2 s: tests/perf/test_discover.py


def overlapping_cache() -> bytes:
    """40000 entries all naming the same 4000-byte path: 160 MB if decoded."""
    long_path = "/" + "a" * 4000
    count = 40000
    table = 48 + 24 * count
    header = NEW_MAGIC + struct.pack("<IIB3xI12x", count, 4002, 2, 0)
    row = struct.pack("<iIIIQ", X86_64, table, table, 0, 0)
    return header + row * count + long_path.encode() + b"\0"


def test_load_names_the_file(tmp_path):
    path = tmp_path / "ld.so.cache"
    path.write_bytes(new_cache(SAMPLE)[:30])
    with pytest.raises(CacheError, match=re.escape(f"{path}: truncated header")):
        ldcache.load(path)


def test_load_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "ld.so.cache"
    os.mkfifo(fifo)
    with pytest.raises(CacheError, match="not a regular file"):
        ldcache.load(fifo)


def test_load_refuses_a_directory(tmp_path):
    with pytest.raises(CacheError, match=f"^{re.escape(str(tmp_path))}: "):
        ldcache.load(tmp_path)


def test_load_missing_file_is_a_cache_error(fs):
    with pytest.raises(CacheError, match=r"^/etc/ld\.so\.cache: cannot read: No such file"):
        ldcache.load("/etc/ld.so.cache")


def test_load_reads_a_file(fs):
    fs.create_file("/etc/ld.so.cache", contents=new_cache(SAMPLE))
    assert _keys_values(ldcache.load(Path("/etc/ld.so.cache"))) == SAMPLE


# --- hostile bytes: CacheError or entries, quickly -----------------------------

VALID = [new_cache(SAMPLE), old_cache(SAMPLE), old_cache(SAMPLE, embedded=new_cache(SAMPLE))]
HOSTILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def parses_or_fails_cleanly(data):
    """Entries or a one-line CacheError (and within a second: tests/perf/test_discover.py)."""
    try:
        entries = ldcache.parse(data)
    except CacheError as e:
        assert "\n" not in str(e)
    else:
        assert all(isinstance(e.key, str) and isinstance(e.value, str) for e in entries)


@HOSTILE
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    parses_or_fails_cleanly(data)


@HOSTILE
@given(st.sampled_from([NEW_MAGIC, OLD_MAGIC]), st.binary(max_size=2048))
def test_random_bytes_after_magic(magic, tail):
    parses_or_fails_cleanly(magic + tail)


@pytest.mark.parametrize("data", VALID, ids=["new", "old", "compat"])
def test_every_truncation(data):
    for size in range(len(data)):
        parses_or_fails_cleanly(data[:size])


@HOSTILE
@given(st.sampled_from(VALID), st.lists(st.integers(min_value=0), min_size=1, max_size=8))
def test_bit_flips(data, positions):
    flipped = bytearray(data)
    for position in positions:
        bit = position % (len(data) * 8)
        flipped[bit // 8] ^= 1 << (bit % 8)
    parses_or_fails_cleanly(bytes(flipped))


# --- genuine caches written by ldconfig ----------------------------------------

_PRINTED = re.compile(r"^\t(?P<key>\S+) \((?P<desc>[^)]*)\) => (?P<value>.+)$")
_ARCH_OF_DESC = {"libc6,x86-64": "x86_64", "libc6": "i386", "ELF": "i386", "libc6,x32": "x32"}


def _printed(cache: Path):
    """What ``ldconfig -p`` says about ``cache``: [(key, arch, value)].

    ``errors="replace"``: glibc 2.36 prints garbage hwcap names for compat caches.
    """
    out = subprocess.run(
        ["ldconfig", "-p", "-C", str(cache)], check=True, capture_output=True, text=True, errors="replace"
    ).stdout
    rows = []
    for line in out.splitlines():
        match = _PRINTED.match(line)
        if match:
            desc = match["desc"].split(", ")[0]
            rows.append((match["key"], _ARCH_OF_DESC.get(desc, desc), match["value"]))
    return rows


def _gcc(tmp_path, out: Path, soname, *flags):
    src = tmp_path / "f.c"
    # Calling into libc makes the library need libc.so.6 (the libc6 flag).
    src.write_text("#include <stdio.h>\nint f(void) { return puts(\"f\"); }\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src), *flags]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}: {result.stderr}")


def _ldconfig_formats():
    if shutil.which("ldconfig") is None:
        return []
    usage = subprocess.run(["ldconfig", "--help"], capture_output=True, text=True).stdout
    return [fmt for fmt in ("new", "old", "compat") if fmt in usage]


needs_toolchain = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("ldconfig") is None or os.geteuid() != 0,
    reason="needs gcc, ldconfig and root (ldconfig -r chroots)",
)


@pytest.fixture(scope="module")
def ldconfig_root(tmp_path_factory):
    """A root with 64-bit, i386 (libc6) and plain 32-bit ELF libraries."""
    root = tmp_path_factory.mktemp("root")
    work = tmp_path_factory.mktemp("src")
    _gcc(work, root / "lib64/libalpha.so.1.0", "libalpha.so.1")
    _gcc(work, root / "lib64/libbeta.so.2", "libbeta.so.2")
    _gcc(work, root / "lib32/libalpha.so.1.0", "libalpha.so.1", "-m32")
    _gcc(work, root / "lib32/libplain.so.3", "libplain.so.3", "-m32", "-nostdlib")
    _gcc(work, root / "lib64/glibc-hwcaps/x86-64-v3/libalpha.so.1.0", "libalpha.so.1")
    (root / "etc").mkdir()
    (root / "etc/ld.so.conf").write_text("/lib64\n/lib32\n")
    return root


@needs_toolchain
@pytest.mark.parametrize("fmt", ["new", "old", "compat"])
def test_matches_ldconfig_print(ldconfig_root, fmt):
    if fmt not in _ldconfig_formats():
        skip(f"this ldconfig cannot write the {fmt} format")
    name = f"/etc/ld.so.cache.{fmt}"
    subprocess.run(["ldconfig", "-X", "-r", str(ldconfig_root), "-c", fmt, "-C", name], check=True)
    cache = ldconfig_root / name.lstrip("/")
    entries = ldcache.load(cache)
    assert [(e.key, e.arch, e.value) for e in entries] == _printed(cache)
    assert {(e.key, e.arch) for e in entries} == {
        ("libalpha.so.1", "x86_64"),
        ("libbeta.so.2", "x86_64"),
        ("libalpha.so.1", "i386"),
        ("libplain.so.3", "i386"),
    }
    hwcaps = [e for e in entries if e.hwcap]
    if fmt != "old":  # the old format has no hwcap field
        assert [(e.value, e.hwcap >> 62) for e in hwcaps] == [
            ("/lib64/glibc-hwcaps/x86-64-v3/libalpha.so.1.0", 1)
        ]
    flags = {e.value: e.flags for e in entries}
    assert flags["/lib32/libalpha.so.1"] == I386
    assert flags["/lib32/libplain.so.3"] == 0x0001
    assert flags["/lib64/libbeta.so.2"] == X86_64


@pytest.mark.skipif(
    not os.path.exists("/etc/ld.so.cache") or shutil.which("ldconfig") is None,
    reason="needs the host's /etc/ld.so.cache and ldconfig",
)
def test_host_cache_matches_ldconfig_print():
    entries = ldcache.load("/etc/ld.so.cache")
    assert [(e.key, e.value) for e in entries] == [
        (key, value) for key, _, value in _printed(Path("/etc/ld.so.cache"))
    ]
