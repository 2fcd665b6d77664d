from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from nvct.discover import ldcache
from nvct.base.errors import CacheError
from nvct.discover.ldcache import Entry

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
        pytest.skip(f"this ldconfig cannot write the {fmt} format")
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


# --- adding entries (the hook's cache patch) ------------------------------------

HOST_CACHE = "/etc/ld.so.cache"
needs_host_cache = pytest.mark.skipif(not os.path.exists(HOST_CACHE), reason=f"needs {HOST_CACHE}")


def _sorted_like_ldconfig(entries):
    """Rows in the order ldconfig writes them: name descending by libcmp, then flags descending."""
    import functools

    def cmp(a, b):
        return -ldcache.libcmp(a[1].encode(), b[1].encode()) or (b[0] - a[0])
    return sorted(entries, key=functools.cmp_to_key(cmp))


@pytest.mark.parametrize("a, b, sign", [
    ("libfoo.so.10", "libfoo.so.9", 1), ("libfoo.so.1", "libfoo.so.01", 0), ("libc.so.6", "libc.so", 1),
    ("libA.so", "liba.so", -1), ("lib1.so", "libx.so", 1), ("libx.so", "lib1.so", -1), ("", "a", -1),
    ("lib99999999999.so", "lib1.so", 1),  # ten digits wrap in C's int, as in glibc
    ("liba.so", "lib\xc3.so", 1), ("lib", "lib\xc3", 1),  # bytes over 127 are negative chars
])
def test_libcmp_compares_digit_runs_as_numbers(a, b, sign):
    result = ldcache.libcmp(a.encode("latin-1"), b.encode("latin-1"))
    assert (result > 0) - (result < 0) == sign


def _glibc_libcmp(a: bytes, b: bytes) -> int:
    """``_dl_cache_libcmp`` as glibc writes it, character by character (the reference for the fast one)."""
    i = j = 0
    while i < len(a):
        ca, cb = a[i], (b[j] if j < len(b) else 0)
        if 48 <= ca <= 57:
            if not 48 <= cb <= 57:
                return 1
            va, i = ldcache._number(a, i)
            vb, j = ldcache._number(b, j)
            if va != vb:
                return ldcache._int32(va - vb)
        elif 48 <= cb <= 57:
            return -1
        elif ca != cb:
            return _char(ca) - _char(cb)
        else:
            i, j = i + 1, j + 1
    return -_char(b[j] if j < len(b) else 0)


def _char(c: int) -> int:
    """A byte as x86's (signed) C ``char``."""
    return c - 256 if c > 127 else c


@given(st.binary(max_size=14).map(lambda b: bytes(b"lib.so0123456789x\xc3"[c % 18] for c in b)),
       st.binary(max_size=6).map(lambda b: bytes(b"lib.so0123456789x\xc3"[c % 18] for c in b)),
       st.integers(min_value=0, max_value=14), st.booleans())
@settings(max_examples=300, deadline=None)
def test_libcmp_orders_as_glibcs_character_walk(a, tail, cut, swap):
    b = a[:cut] + tail  # mostly a shared prefix, as library names have
    if swap:
        a, b = b, a
    fast, walk = ldcache.libcmp(a, b), _glibc_libcmp(a, b)
    assert (fast > 0) - (fast < 0) == (walk > 0) - (walk < 0)


@needs_host_cache
def test_libcmp_agrees_with_the_order_the_host_ldconfig_wrote():
    keys = [e.key.encode() for e in ldcache.load(HOST_CACHE)]
    assert len(keys) > 10
    assert all(ldcache.libcmp(a, b) >= 0 for a, b in zip(keys, keys[1:]))


def test_added_entries_go_before_the_images_own_of_that_name():
    data = new_cache(_sorted_like_ldconfig([(X86_64, "libz.so.1", "/lib/libz.so.1"),
                                            (X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1"),
                                            (I386, "libcuda.so.1", "/lib32/libcuda.so.1"),
                                            (X86_64, "libc.so.6", "/lib/libc.so.6")]))
    new = [Entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64),
           Entry("libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so", X86_64)]
    out = ldcache.parse(ldcache.add(data, new))
    assert _keys_values(out) == [
        (X86_64, "libz.so.1", "/lib/libz.so.1"),
        (X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        (X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1"),
        (I386, "libcuda.so.1", "/lib32/libcuda.so.1"),
        (X86_64, "libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so"),
        (X86_64, "libc.so.6", "/lib/libc.so.6"),
    ]


def test_adding_what_the_cache_already_resolves_changes_nothing():
    data = new_cache([(X86_64, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")])
    assert ldcache.add(data, [Entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64)]) is data


def test_an_old_entry_identical_to_a_new_one_is_dropped():
    data = new_cache([(X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1"),
                      (X86_64, "libcuda.so.1", "/usr/lib/libcuda.so.1")])
    out = ldcache.parse(ldcache.add(data, [Entry("libcuda.so.1", "/usr/lib/libcuda.so.1", X86_64)]))
    assert _keys_values(out) == [(X86_64, "libcuda.so.1", "/usr/lib/libcuda.so.1"),
                                 (X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1")]


@given(st.lists(st.tuples(st.sampled_from([X86_64, I386]),
                          st.from_regex(r"lib[a-c0-9]{0,3}\.so(\.[0-9]{1,3}){0,2}", fullmatch=True)),
                min_size=0, max_size=30),
       st.lists(st.from_regex(r"lib[a-c0-9]{0,3}\.so(\.[0-9]{1,3}){0,2}", fullmatch=True),
                min_size=1, max_size=8, unique_by=lambda k: _libcmp_key(k)))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_added_entry_is_where_the_loader_looks(image, added):
    old = _sorted_like_ldconfig([(f, k, f"/image/{i}/{k}") for i, (f, k) in enumerate(image)])
    new = [Entry(k, f"/drv/{k}", X86_64) for k in added]
    out = ldcache.parse(ldcache.add(new_cache(old), new))
    assert len(out) == len(old) + len(new)
    for e in new:  # glibc's search: the first entry of that name (libcmp) with these flags
        same = [x for x in out if ldcache.libcmp(x.key.encode(), e.key.encode()) == 0 and x.flags == X86_64]
        assert same[0].value == e.value
    keys = [x.key.encode() for x in out]
    assert all(ldcache.libcmp(a, b) >= 0 for a, b in zip(keys, keys[1:]))


def _libcmp_key(name: str) -> str:
    """``name`` with its digit runs as numbers: names glibc's libcmp calls equal get one key."""
    import re

    return re.sub(r"[0-9]+", lambda m: str(int(m.group())), name)


def test_two_new_names_the_loader_cannot_tell_apart_are_left_to_ldconfig():
    """glibc's libcmp reads digit runs as numbers, so lib0.so and lib00.so are one name to the
    loader: whichever comes first answers for both. No patch can make both found; ldconfig runs
    (and writes what it always writes)."""
    new = [Entry("lib0.so", "/drv/lib0.so", X86_64), Entry("lib00.so", "/drv/lib00.so", X86_64)]
    assert ldcache.libcmp(b"lib0.so", b"lib00.so") == 0
    with pytest.raises(CacheError, match="the loader would not find the new entry"):
        ldcache.add(new_cache([]), new)


@pytest.mark.parametrize("data, why", [
    (old_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]), "not a new-format cache"),
    (new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")], order=">" if NATIVE == "<" else "<",
               endian_flag=3 if NATIVE == "<" else 2), "foreign byte order"),
    (new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]) + b"junk", "data after the string table"),
])
def test_caches_it_cannot_patch_exactly_are_refused(data, why):
    with pytest.raises(CacheError, match=why):
        ldcache.add(data, [Entry("libcuda.so.1", "/usr/lib/libcuda.so.1", X86_64)])


def _with_extension(data: bytes, tag: int, payload: bytes) -> bytes:
    """``data`` plus an extension directory of one section, as glibc >= 2.33 writes it."""
    data = data + b"\0" * (-len(data) % 4)
    directory = struct.pack(NATIVE + "II", 0xEAA42174, 1)
    at = len(data) + len(directory) + 16
    directory += struct.pack(NATIVE + "IIII", tag, 0, at, len(payload))
    return data[:32] + struct.pack(NATIVE + "I", len(data)) + data[36:] + directory + payload


def test_an_unknown_extension_is_refused_and_the_generator_kept():
    data = new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")])
    with pytest.raises(CacheError, match="unknown extension 7"):
        ldcache.add(_with_extension(data, 7, b"????"), [Entry("libcuda.so.1", "/lib/libcuda.so.1", X86_64)])
    new = [Entry("libcuda.so.1", "/lib/libcuda.so.1", X86_64)]
    out = ldcache.add(_with_extension(data, 0, b"ldconfig (test)"), new)
    (offset,) = struct.unpack_from(NATIVE + "I", out, 32)
    tag, _, at, size = struct.unpack_from(NATIVE + "IIII", out, offset + 8)
    assert (tag, out[at:at + size]) == (0, b"ldconfig (test)")


def test_a_name_the_loader_would_not_find_is_refused():
    data = new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")])
    twice = [Entry("libcuda.so.1", "/a/libcuda.so.1", X86_64), Entry("libcuda.so.1", "/b/libcuda.so.1", X86_64)]
    with pytest.raises(CacheError, match="would not find the new entry"):
        ldcache.add(data, twice)


# --- extensions glibc reads otherwise than the patch would move them ---------------

_EXT_MAGIC = 0xEAA42174


def _relaid(data: bytes, descriptors, *, dir_pad: int = 0, payload_pad: int = 0, payloads=None) -> bytes:
    """``data`` (a new-format cache) with its extension area laid out again.

    The payloads (``payloads``, else the sections ``data`` has, in order) go
    4-aligned after the directory, with 16 spare bytes at the end; ``descriptors``:
    (tag, payload index, offset change, size change) per directory slot, so a payload
    can be named twice, moved, cut or overlapped. ``dir_pad`` bytes before the
    directory, ``payload_pad`` before the payloads.
    """
    (ext,) = struct.unpack_from(NATIVE + "I", data, 32)
    head = data[:ext] if ext else data
    if payloads is None:
        (count,) = struct.unpack_from(NATIVE + "I", data, ext + 4)
        payloads = []
        for i in range(count):
            _, _, at, size = struct.unpack_from(NATIVE + "IIII", data, ext + 8 + 16 * i)
            payloads.append(data[at:at + size])
    base = len(head) + dir_pad
    at = base + 8 + 16 * len(descriptors) + payload_pad
    offsets, region = [], b""
    for payload in payloads:
        offsets.append(at + len(region))
        region += payload + b"\0" * (-len(payload) % 4)
    directory = struct.pack(NATIVE + "II", _EXT_MAGIC, len(descriptors)) + b"".join(
        struct.pack(NATIVE + "IIII", tag, 0, max(0, offsets[i] + moved), max(0, len(payloads[i]) + grown))
        for tag, i, moved, grown in descriptors)
    out = bytearray(head + b"\0" * dir_pad + directory + b"\0" * payload_pad + region + bytes(16))
    struct.pack_into(NATIVE + "I", out, 32, base)
    return bytes(out)


def _hwcaps_cache() -> bytes:
    """A cache as ldconfig >= 2.33 lays it out: strings, directory, generator, glibc-hwcaps."""
    data = bytearray(new_cache([(X86_64, "libm.so.6", "/lib/glibc-hwcaps/x86-64-v3/libm.so.6", 0, 1 << 62),
                                (X86_64, "libm.so.6", "/lib/libm.so.6")]))
    name = len(data)  # the subdirectory's name, last in the string table
    data += b"x86-64-v3\0" + b"\0" * (-(len(data) + 10) % 4)
    struct.pack_into(NATIVE + "I", data, 24, name + 10 - 48 - 24 * 2)
    return _relaid(bytes(data), [GEN, HW], payloads=[b"ldconfig (GNU libc) test\0", struct.pack(NATIVE + "I", name)])


CUDA = [Entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64)]
GEN, HW = (0, 0, 0, 0), (1, 1, 0, 0)


def test_a_cache_with_extensions_laid_out_as_ldconfig_does_is_patched():
    data = _hwcaps_cache()
    out = ldcache.add(data, CUDA)
    first = ldcache.parse(out)[0]
    assert (first.key, first.value) == ("libm.so.6", "/lib/glibc-hwcaps/x86-64-v3/libm.so.6")
    assert ldcache.add(_relaid(data, [HW, GEN]), CUDA)  # any order of sections


@pytest.mark.parametrize("descriptors, layout, why", [
    ([GEN, HW, HW], {}, "extension 1 twice"),  # the shared bytes would be moved twice
    ([GEN, HW, (1, 1, 8, 0)], {}, "extension 1 twice"),  # even apart: glibc reads only the last
    ([GEN, GEN, HW], {}, "extension 0 twice"),
    ([(0, 0, 0, 8), HW], {}, "overlap"),  # the generator runs into the names
    ([GEN, (1, 0, 0, -20)], {}, "overlap"),  # the names are the generator's bytes
    ([GEN, HW], {"dir_pad": 2}, "extension directory out of place"),  # glibc ignores it: misaligned
    ([GEN, HW], {"payload_pad": 2}, "bad glibc-hwcaps"),  # glibc drops a misaligned glibc-hwcaps
    ([GEN, (1, 1, 0, -4)], {}, "bad glibc-hwcaps"),  # glibc drops an empty one
    ([GEN, (1, 1, 0, 2)], {}, "bad glibc-hwcaps"),
    ([GEN, (1, 1, 0, 4096)], {}, "out of place"),  # past the end of the file: glibc drops all
    ([GEN, (1, 1, -(8 + 32 + 4), 0)], {}, "out of place"),  # inside the directory
])
def test_extensions_glibc_would_read_otherwise_are_refused(descriptors, layout, why):
    with pytest.raises(CacheError, match=why):
        ldcache.add(_relaid(_hwcaps_cache(), descriptors, **layout), CUDA)


def test_a_cache_out_of_the_loaders_order_is_refused():
    """The loader's binary search finds the old names again in a longer table only if it is sorted."""
    data = new_cache([(X86_64, "liba.so.1", "/lib/liba.so.1"), (X86_64, "libz.so.1", "/lib/libz.so.1")])
    with pytest.raises(CacheError, match="out of the loader's order"):
        ldcache.add(data, CUDA)


@pytest.mark.parametrize("key", ["lib1234567890.so", "lib00000000001.so"])
def test_a_digit_run_that_wraps_in_c_is_refused(key):
    data = new_cache([(X86_64, key, f"/lib/{key}")])
    with pytest.raises(CacheError, match="ten or more digits"):
        ldcache.add(data, CUDA)
    with pytest.raises(CacheError, match="ten or more digits"):
        ldcache.add(new_cache([]), [Entry(key, f"/drv/{key}", X86_64)])


def test_a_string_table_without_its_final_nul_is_refused():
    data = bytearray(new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]))
    struct.pack_into(NATIVE + "I", data, 24, struct.unpack_from(NATIVE + "I", data, 24)[0] - 1)
    with pytest.raises(CacheError, match="does not end in a NUL"):
        ldcache.add(bytes(data[:-1]), CUDA)


# --- the real loader on mutated caches: an image that worked still works ---------------

HWLIB = "libnvcthw.so.1"
LIBDIR = "/usr/lib/x86_64-linux-gnu"
INJECTED = [Entry("libcuda.so.1", f"{LIBDIR}/libcuda.so.1", X86_64)] + [
    Entry(f"libnvidia-x{i}.so.1", f"{LIBDIR}/libnvidia-x{i}.so.1", X86_64) for i in range(40)]
PROBED = (HWLIB, "libm.so.6", "libcuda.so.1")


def hwcaps_image(parent) -> str:
    """A test rootfs whose libc and ``libnvcthw.so.1`` have glibc-hwcaps copies (x86-64-v2) in its
    ld cache, as ldconfig writes it: every dynamic program there reads the glibc-hwcaps extension."""
    from tests.support.rootfs import make_rootfs, refresh_ld_cache

    root = make_rootfs(parent, name="hwcaps-root")
    libdir = os.path.join(root, LIBDIR.lstrip("/"))
    hwcaps = os.path.join(libdir, "glibc-hwcaps/x86-64-v2")
    os.makedirs(hwcaps)
    _gcc(Path(parent), Path(libdir) / HWLIB, HWLIB)
    shutil.copy(os.path.join(libdir, HWLIB), hwcaps)
    shutil.copy(os.path.join(root, "lib/x86_64-linux-gnu/libc.so.6"), hwcaps)
    refresh_ld_cache(root)
    return root


def _probe(root: str) -> subprocess.CompletedProcess:
    return subprocess.run(["chroot", root, "/usr/local/bin/dlopen-probe", *PROBED], capture_output=True, text=True)


def _results(proc: subprocess.CompletedProcess) -> dict:
    return {line.split(" ")[1]: line for line in proc.stdout.splitlines()}


@pytest.fixture(scope="module")
def loader_image(tmp_path_factory):
    from tests.support.fixtures import need_rootfs_tools

    need_rootfs_tools()
    if os.geteuid() != 0:
        pytest.skip("needs root (chroot)")
    root = hwcaps_image(tmp_path_factory.mktemp("loader"))
    shutil.copy(os.path.join(root, LIBDIR.lstrip("/"), HWLIB), os.path.join(root, LIBDIR.lstrip("/"), "libcuda.so.1"))
    with open(os.path.join(root, "etc/ld.so.cache"), "rb") as f:
        cache = f.read()
    assert _results(_probe(root))[HWLIB].endswith(f"/glibc-hwcaps/x86-64-v2/{HWLIB}")  # the loader reads it
    return root, cache


# Directory slots: mostly the two sections ldconfig writes, else one moved, cut, grown into
# its neighbour, of an unknown tag, or the generator's bytes read as glibc-hwcaps names.
_SLOTS = st.sampled_from([GEN, HW] * 4 + [(2, 0, 0, 0), (1, 1, 4, 0), (1, 1, -4, 4), (0, 0, 0, 8),
                                          (1, 0, 0, -8), (1, 1, 0, -4), (1, 1, 2, 0)])


# An entry's hwcap: none, a glibc-hwcaps index (in range or not, with an x86 ISA level), legacy bits.
_HWCAPS = st.sampled_from([0, 1 << 62, (1 << 62) | 1, (1 << 62) | (2 << 32), (1 << 62) | 7, 1 << 3])
_FLAGS = st.sampled_from([X86_64, I386, 0x0001, 0x0A03])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@example(descriptors=[GEN, HW, HW, HW, HW], dir_pad=0, payload_pad=0, swap=None, cut=False,
         retag=None)  # the shared bytes moved four times: SIGSEGV
@example(descriptors=[GEN, HW, HW], dir_pad=0, payload_pad=0, swap=None, cut=False, retag=None)
@given(descriptors=st.lists(_SLOTS, min_size=1, max_size=5), dir_pad=st.sampled_from([0, 0, 0, 2, 4]),
       payload_pad=st.sampled_from([0, 0, 2]), swap=st.none() | st.integers(min_value=0, max_value=200),
       cut=st.sampled_from([False] * 5 + [True]),
       retag=st.none() | st.tuples(st.integers(min_value=0, max_value=200), _FLAGS, _HWCAPS))
def test_an_image_that_worked_still_works_after_the_patch(loader_image, descriptors, dir_pad, payload_pad,
                                                          swap, cut, retag):
    """Mutated extension directories and tables, as glibc accepts them: the loader (dlopen-probe
    in a chroot of the image) finds after the patch every library it found before, at the same
    path, and the injected one too; a cache the patch refuses is left to ldconfig."""
    root, cache = loader_image
    data = bytearray(_relaid(cache, descriptors, dir_pad=dir_pad, payload_pad=payload_pad))
    nlibs, len_strings = struct.unpack_from(NATIVE + "II", data, 20)
    if swap is not None and nlibs > 1:  # two neighbours swapped: out of order
        i = 48 + 24 * (swap % (nlibs - 1))
        data[i:i + 48] = data[i + 24:i + 48] + data[i:i + 24]
    if retag is not None and nlibs:  # one entry's flags and hwcap changed
        i = 48 + 24 * (retag[0] % nlibs)
        struct.pack_into(NATIVE + "i", data, i, retag[1])
        struct.pack_into(NATIVE + "Q", data, i + 16, retag[2])
    if cut:  # the string table one byte short of its final NUL
        struct.pack_into(NATIVE + "I", data, 24, len_strings - 1)
    path = os.path.join(root, "etc/ld.so.cache")
    with open(path, "wb") as f:
        f.write(data)
    before = _probe(root)
    try:
        patched = ldcache.add(bytes(data), INJECTED)
    except CacheError as e:
        event(f"left to ldconfig: {str(e).split(': ', 1)[1].split(' (')[0]}")
        return  # ldconfig writes the cache afresh
    event("patched")
    with open(path, "wb") as f:
        f.write(patched)
    after = _probe(root)
    assert after.returncode in (0, 1), f"the loader died: {after}"
    if before.returncode not in (0, 1):
        return  # the image did not work before
    worked, works = _results(before), _results(after)
    assert works["libcuda.so.1"] == f"ok libcuda.so.1 {LIBDIR}/libcuda.so.1"
    assert {k: v for k, v in works.items() if k != "libcuda.so.1"} == \
        {k: v for k, v in worked.items() if k != "libcuda.so.1"}
