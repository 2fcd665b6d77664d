"""Adding entries to an image's ld.so.cache as ldconfig would (nvct.rootfs.cachepatch)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

from nvct.base.errors import CacheError
from nvct.discover import ldcache
from nvct.discover.ldcache import Entry
from nvct.rootfs import cachepatch
from tests.discover.test_ldcache import I386, NATIVE, X86_64, _gcc, _keys_values, new_cache, old_cache

HOST_CACHE = "/etc/ld.so.cache"
needs_host_cache = pytest.mark.skipif(not os.path.exists(HOST_CACHE), reason=f"needs {HOST_CACHE}")


def _sorted_like_ldconfig(entries):
    """Rows in the order ldconfig writes them: name descending by libcmp, then flags descending."""
    import functools

    def cmp(a, b):
        return -cachepatch.libcmp(a[1].encode(), b[1].encode()) or (b[0] - a[0])
    return sorted(entries, key=functools.cmp_to_key(cmp))


@pytest.mark.parametrize("a, b, sign", [
    ("libfoo.so.10", "libfoo.so.9", 1), ("libfoo.so.1", "libfoo.so.01", 0), ("libc.so.6", "libc.so", 1),
    ("libA.so", "liba.so", -1), ("lib1.so", "libx.so", 1), ("libx.so", "lib1.so", -1), ("", "a", -1),
    ("lib99999999999.so", "lib1.so", 1),  # ten digits wrap in C's int, as in glibc
    ("liba.so", "lib\xc3.so", 1), ("lib", "lib\xc3", 1),  # bytes over 127 are negative chars
])
def test_libcmp_compares_digit_runs_as_numbers(a, b, sign):
    result = cachepatch.libcmp(a.encode("latin-1"), b.encode("latin-1"))
    assert (result > 0) - (result < 0) == sign


def _glibc_libcmp(a: bytes, b: bytes) -> int:
    """``_dl_cache_libcmp`` as glibc writes it, character by character (the reference for the fast one)."""
    i = j = 0
    while i < len(a):
        ca, cb = a[i], (b[j] if j < len(b) else 0)
        if 48 <= ca <= 57:
            if not 48 <= cb <= 57:
                return 1
            va, i = cachepatch._number(a, i)
            vb, j = cachepatch._number(b, j)
            if va != vb:
                return cachepatch._int32(va - vb)
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
    fast, walk = cachepatch.libcmp(a, b), _glibc_libcmp(a, b)
    assert (fast > 0) - (fast < 0) == (walk > 0) - (walk < 0)


@needs_host_cache
def test_libcmp_agrees_with_the_order_the_host_ldconfig_wrote():
    keys = [e.key.encode() for e in ldcache.load(HOST_CACHE)]
    assert len(keys) > 10
    assert all(cachepatch.libcmp(a, b) >= 0 for a, b in zip(keys, keys[1:]))


def test_added_entries_go_before_the_images_own_of_that_name():
    data = new_cache(_sorted_like_ldconfig([(X86_64, "libz.so.1", "/lib/libz.so.1"),
                                            (X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1"),
                                            (I386, "libcuda.so.1", "/lib32/libcuda.so.1"),
                                            (X86_64, "libc.so.6", "/lib/libc.so.6")]))
    new = [Entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64),
           Entry("libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so", X86_64)]
    out = ldcache.parse(cachepatch.add(data, new))
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
    assert cachepatch.add(data, [Entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64)]) is data


def test_an_old_entry_identical_to_a_new_one_is_dropped():
    data = new_cache([(X86_64, "libcuda.so.1", "/opt/stub/libcuda.so.1"),
                      (X86_64, "libcuda.so.1", "/usr/lib/libcuda.so.1")])
    out = ldcache.parse(cachepatch.add(data, [Entry("libcuda.so.1", "/usr/lib/libcuda.so.1", X86_64)]))
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
    out = ldcache.parse(cachepatch.add(new_cache(old), new))
    assert len(out) == len(old) + len(new)
    for e in new:  # glibc's search: the first entry of that name (libcmp) with these flags
        same = [x for x in out if cachepatch.libcmp(x.key.encode(), e.key.encode()) == 0 and x.flags == X86_64]
        assert same[0].value == e.value
    keys = [x.key.encode() for x in out]
    assert all(cachepatch.libcmp(a, b) >= 0 for a, b in zip(keys, keys[1:]))


def _libcmp_key(name: str) -> str:
    """``name`` with its digit runs as numbers: names glibc's libcmp calls equal get one key."""
    import re

    return re.sub(r"[0-9]+", lambda m: str(int(m.group())), name)


def test_two_new_names_the_loader_cannot_tell_apart_are_left_to_ldconfig():
    """glibc's libcmp reads digit runs as numbers, so lib0.so and lib00.so are one name to the
    loader: whichever comes first answers for both. No patch can make both found; ldconfig runs
    (and writes what it always writes)."""
    new = [Entry("lib0.so", "/drv/lib0.so", X86_64), Entry("lib00.so", "/drv/lib00.so", X86_64)]
    assert cachepatch.libcmp(b"lib0.so", b"lib00.so") == 0
    with pytest.raises(CacheError, match="the loader would not find the new entry"):
        cachepatch.add(new_cache([]), new)


@pytest.mark.parametrize("data, why", [
    (old_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]), "not a new-format cache"),
    (new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")], order=">" if NATIVE == "<" else "<",
               endian_flag=3 if NATIVE == "<" else 2), "foreign byte order"),
    (new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]) + b"junk", "data after the string table"),
])
def test_caches_it_cannot_patch_exactly_are_refused(data, why):
    with pytest.raises(CacheError, match=why):
        cachepatch.add(data, [Entry("libcuda.so.1", "/usr/lib/libcuda.so.1", X86_64)])


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
        cachepatch.add(_with_extension(data, 7, b"????"), [Entry("libcuda.so.1", "/lib/libcuda.so.1", X86_64)])
    new = [Entry("libcuda.so.1", "/lib/libcuda.so.1", X86_64)]
    out = cachepatch.add(_with_extension(data, 0, b"ldconfig (test)"), new)
    (offset,) = struct.unpack_from(NATIVE + "I", out, 32)
    tag, _, at, size = struct.unpack_from(NATIVE + "IIII", out, offset + 8)
    assert (tag, out[at:at + size]) == (0, b"ldconfig (test)")


def test_a_name_the_loader_would_not_find_is_refused():
    data = new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")])
    twice = [Entry("libcuda.so.1", "/a/libcuda.so.1", X86_64), Entry("libcuda.so.1", "/b/libcuda.so.1", X86_64)]
    with pytest.raises(CacheError, match="would not find the new entry"):
        cachepatch.add(data, twice)


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
    out = cachepatch.add(data, CUDA)
    first = ldcache.parse(out)[0]
    assert (first.key, first.value) == ("libm.so.6", "/lib/glibc-hwcaps/x86-64-v3/libm.so.6")
    assert cachepatch.add(_relaid(data, [HW, GEN]), CUDA)  # any order of sections


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
        cachepatch.add(_relaid(_hwcaps_cache(), descriptors, **layout), CUDA)


def test_a_cache_out_of_the_loaders_order_is_refused():
    """The loader's binary search finds the old names again in a longer table only if it is sorted."""
    data = new_cache([(X86_64, "liba.so.1", "/lib/liba.so.1"), (X86_64, "libz.so.1", "/lib/libz.so.1")])
    with pytest.raises(CacheError, match="out of the loader's order"):
        cachepatch.add(data, CUDA)


@pytest.mark.parametrize("key", ["lib1234567890.so", "lib00000000001.so"])
def test_a_digit_run_that_wraps_in_c_is_refused(key):
    data = new_cache([(X86_64, key, f"/lib/{key}")])
    with pytest.raises(CacheError, match="ten or more digits"):
        cachepatch.add(data, CUDA)
    with pytest.raises(CacheError, match="ten or more digits"):
        cachepatch.add(new_cache([]), [Entry(key, f"/drv/{key}", X86_64)])


def test_a_string_table_without_its_final_nul_is_refused():
    data = bytearray(new_cache([(X86_64, "libc.so.6", "/lib/libc.so.6")]))
    struct.pack_into(NATIVE + "I", data, 24, struct.unpack_from(NATIVE + "I", data, 24)[0] - 1)
    with pytest.raises(CacheError, match="does not end in a NUL"):
        cachepatch.add(bytes(data[:-1]), CUDA)


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
    from tests.support.fixtures import need_rootfs_tools, skip

    need_rootfs_tools()
    if os.geteuid() != 0:
        skip("needs root (chroot)")
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
        patched = cachepatch.add(bytes(data), INJECTED)
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
