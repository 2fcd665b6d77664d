"""Read glibc's ``/etc/ld.so.cache`` without running ``ldconfig -p``.

Driver discovery runs on every GPU container start, so this is a direct,
bounds-checked parse of the binary file: hostile or corrupt bytes give a
one-line :class:`~nvct.base.errors.CacheError`, never a hang or a traceback.

Two layouts exist (glibc ``dl-cache.h``), both in the byte order of the
machine that wrote them:

* old, magic ``ld.so-1.7.0``: 16-byte header (magic, ``nlibs`` at 12), then
  12-byte entries ``(flags, key, value)``; string offsets count from the end
  of the entry table. ``ldconfig -c compat`` appends a new-format cache right
  after that table (aligned), whose entries we then prefer.
* new, magic ``glibc-ld.so.cache1.1`` (the only one glibc >= 2.32 writes):
  48-byte header (``nlibs`` at 20, string table length at 24, a byte-order
  flag at 28), then 24-byte entries ``(flags, key, value, osversion, hwcap)``;
  string offsets count from the start of that header.
"""

from __future__ import annotations

import os
import stat
import struct
import sys

from nvct.base.errors import CacheError

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Callable

__all__ = ["Entry", "parse", "load"]

_OLD_MAGIC = b"ld.so-1.7.0"
_OLD_HEADER_SIZE = 16
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER_SIZE = 48

# Byte-order flag in the new header (glibc >= 2.33); 0 means "not recorded".
_ENDIAN_UNSET, _ENDIAN_INVALID, _ENDIAN_LITTLE, _ENDIAN_BIG = range(4)
_NATIVE = "<" if sys.byteorder == "little" else ">"

# A path longer than PATH_MAX is corrupt; the bound also keeps each string
# search short so that hostile offsets cannot make parsing quadratic.
_MAX_STRING = 4096
# Real caches are well under a megabyte; refuse to slurp a huge file.
_MAX_FILE_SIZE = 16 * 1024 * 1024

_TYPE_MASK = 0x00FF
_REQUIRED_MASK = 0xFF00
_ELF_TYPES = (0x0001, 0x0002, 0x0003)  # FLAG_ELF, FLAG_ELF_LIBC5, FLAG_ELF_LIBC6

# FLAG_*_LIB* "required" bits -> architecture name.  No bits at all marks a
# plain 32-bit entry, which on the hosts NVIDIA's drivers support is i386 (an
# x86-64 host's compat32 libraries; arm64 ldconfig flags its own AArch64).
_ARCHES = {
    0x0000: "i386",
    0x0100: "sparc64",
    0x0200: "ia64",
    0x0300: "x86_64",
    0x0400: "s390x",
    0x0500: "ppc64",
    0x0600: "mips64-n32",
    0x0700: "mips64",
    0x0800: "x32",
    0x0900: "armhf",
    0x0A00: "aarch64",
    0x0B00: "armel",
    0x0C00: "mips-nan2008",
    0x0D00: "mips64-n32-nan2008",
    0x0E00: "mips64-nan2008",
    0x0F00: "riscv-soft-float",
    0x1000: "riscv64",
    0x1100: "loongarch-soft-float",
    0x1200: "loongarch64",
}


class Entry(tuple):
    """One cache line: ``key`` (the SONAME) resolves to ``value`` (a path).

    ``hwcap`` is kept raw: bit 62 set means the library lives in a
    ``glibc-hwcaps`` subdirectory (e.g. ``x86-64-v3``). A tuple, because this
    is built hundreds of times on every container start; not a namedtuple,
    whose ``collections`` import costs every start ~2 ms.
    """

    __slots__ = ()

    def __new__(cls, key: str, value: str, flags: int, osversion: int = 0, hwcap: int = 0):
        return tuple.__new__(cls, (key, value, flags, osversion, hwcap))

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        return "Entry(key=%r, value=%r, flags=%r, osversion=%r, hwcap=%r)" % self

    key = property(lambda self: self[0])
    value = property(lambda self: self[1])
    flags = property(lambda self: self[2])
    osversion = property(lambda self: self[3])
    hwcap = property(lambda self: self[4])

    @property
    def arch(self) -> str:
        """The ABI the library was built for, e.g. ``'x86_64'`` or ``'i386'``."""
        if self.flags & _TYPE_MASK not in _ELF_TYPES:
            return "unknown"
        return _ARCHES.get(self.flags & _REQUIRED_MASK, "unknown")


def load(path: str | os.PathLike[str]) -> list[Entry]:
    """Parse the cache file at ``path``."""
    source = os.fspath(path)
    try:
        # Non-blocking, so that a FIFO planted in an image cannot hang us.
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CacheError(f"{source}: not a regular file")
            data = f.read(_MAX_FILE_SIZE + 1)
    except OSError as e:
        raise CacheError(f"{source}: cannot read: {e.strerror or e}") from None
    if len(data) > _MAX_FILE_SIZE:
        raise CacheError(f"{source}: larger than {_MAX_FILE_SIZE} bytes")
    return parse(data, source=source)


def parse(data: bytes, *, source: str = "ld.so.cache") -> list[Entry]:
    """Parse cache bytes in either format; ``source`` names them in errors."""
    data = bytes(data)
    if data.startswith(_NEW_MAGIC):
        return _parse_new(data, 0, source)
    if data.startswith(_OLD_MAGIC):
        return _parse_old(data, source)
    raise CacheError(f"{source}: bad magic, not an ld.so.cache file")


def _parse_old(data: bytes, source: str) -> list[Entry]:
    if len(data) < _OLD_HEADER_SIZE:
        raise CacheError(f"{source}: truncated header")
    (nlibs,) = struct.unpack_from(_NATIVE + "I", data, 12)
    table_end = _check_table(data, _OLD_HEADER_SIZE, nlibs, 12, source)
    # A compat cache embeds a new-format one after the table, aligned to
    # alignof(struct cache_file_new): 8 on 64-bit writers, 4 on 32-bit ones.
    for start in ((table_end + 7) & ~7, table_end):
        if data.startswith(_NEW_MAGIC, start):
            return _parse_new(data, start, source)
    table = memoryview(data)[_OLD_HEADER_SIZE:table_end]
    string = _strings(data, table_end, source)
    return [
        Entry(string(key), string(value), flags)
        for flags, key, value in struct.iter_unpack(_NATIVE + "iII", table)
    ]


def _parse_new(data: bytes, base: int, source: str) -> list[Entry]:
    if len(data) - base < _NEW_HEADER_SIZE:
        raise CacheError(f"{source}: truncated header")
    order = _new_byte_order(data[base + 28] & 3, source)
    (nlibs,) = struct.unpack_from(order + "I", data, base + 20)
    start = base + _NEW_HEADER_SIZE
    table_end = _check_table(data, start, nlibs, 24, source)
    table = memoryview(data)[start:table_end]
    string = _strings(data, base, source)
    return [
        Entry(string(key), string(value), flags, osversion, hwcap)
        for flags, key, value, osversion, hwcap in struct.iter_unpack(
            order + "iIIIQ", table
        )
    ]


def _new_byte_order(flag: int, source: str) -> str:
    if flag == _ENDIAN_LITTLE:
        return "<"
    if flag == _ENDIAN_BIG:
        return ">"
    if flag == _ENDIAN_UNSET:
        return _NATIVE
    raise CacheError(f"{source}: invalid byte-order flag in header")


def _check_table(data: bytes, start: int, nlibs: int, size: int, source: str) -> int:
    """Return the end of an ``nlibs``-entry table, checked against the file."""
    if nlibs > (len(data) - start) // size:
        raise CacheError(
            f"{source}: entry table past end ({nlibs} entries of {size} bytes"
            f" at offset {start}, file is {len(data)} bytes)"
        )
    return start + nlibs * size


def _strings(data: bytes, base: int, source: str) -> Callable[[int], str]:
    """A reader of the NUL-terminated strings at offsets from ``base``.

    Entries may share or overlap strings, so a hostile file could decode the
    same long string once per entry; the total is capped at a small multiple
    of the file size, far above what ``ldconfig`` ever writes.
    """
    budget = 4 * len(data) + 65536

    def read(offset: int) -> str:
        nonlocal budget
        start = base + offset
        end = data.find(b"\0", start, start + _MAX_STRING)
        if end < 0:
            if start >= len(data):
                raise CacheError(f"{source}: string offset {offset} out of range")
            raise CacheError(f"{source}: unterminated string at offset {offset}")
        budget -= end - start
        if budget < 0:
            raise CacheError(f"{source}: strings overlap implausibly often")
        return data[start:end].decode("utf-8", "surrogateescape")

    return read


# -- adding entries ---------------------------------------------------------

_EXTENSION_MAGIC = 0xEAA42174
_TAG_GENERATOR, _TAG_GLIBC_HWCAPS = 0, 1
_MAX_EXTENSIONS = 64
_HWCAP_EXTENSION = 1 << 30  # the upper 32 bits of an entry's hwcap for a glibc-hwcaps entry
_ISA_LEVEL_MASK = 0x3FF  # ... but for these, the x86 ISA level ldconfig records there


def add(data: bytes, entries: list[Entry], *, source: str = "ld.so.cache") -> bytes:
    """``data`` (a new-format cache, as glibc >= 2.32 writes it) with ``entries`` added.

    What ldconfig would write for those libraries, without rescanning the
    image's folders: each new entry goes where glibc's sort puts it, before
    any other entry of the same name, flags and hwcap, as an entry from a
    folder scanned first would; an old entry identical to a new one is
    dropped. Everything else — entries, strings, the generator and
    glibc-hwcaps extensions — is kept, its offsets moved. ``data`` itself
    when the loader finds every entry there already. Raises
    :class:`CacheError` for a cache this cannot patch exactly, that is one
    that glibc's loader might read differently before and after the patch
    (the old or compat format, a foreign byte order, strings outside the
    string table, entries out of the loader's order, extensions glibc would
    ignore, pick among or read overlapped: :func:`_extensions`); the caller
    then runs ldconfig, which writes the whole cache afresh.
    """
    if not data.startswith(_NEW_MAGIC):
        raise CacheError(f"{source}: not a new-format cache")
    if len(data) < _NEW_HEADER_SIZE or _new_byte_order(data[28] & 3, source) != _NATIVE:
        raise CacheError(f"{source}: foreign byte order or truncated header")
    nlibs, len_strings = struct.unpack_from("=II", data, 20)
    (ext_offset,) = struct.unpack_from("=I", data, 32)
    strings_start = _check_table(data, _NEW_HEADER_SIZE, nlibs, 24, source)
    strings_end = strings_start + len_strings
    if strings_end > len(data):
        raise CacheError(f"{source}: string table past end")
    # Every string then ends inside the table, as it did before the new strings followed it.
    if len_strings and data[strings_end - 1]:
        raise CacheError(f"{source}: string table does not end in a NUL")
    old = list(struct.iter_unpack("=iIIIQ", memoryview(data)[_NEW_HEADER_SIZE:strings_start]))
    for _, key, value, _, _ in old:
        if not (strings_start <= key < strings_end and strings_start <= value < strings_end):
            raise CacheError(f"{source}: entry string outside the string table")
    sections = _extensions(data, ext_offset, strings_start, strings_end, source)

    def text(at: int) -> bytes:
        stop = data.find(b"\0", at, min(at + _MAX_STRING, strings_end))
        if stop < 0:
            raise CacheError(f"{source}: unterminated string at offset {at}")
        return data[at:stop]

    def name(row: tuple) -> bytes:
        return row[5] if row[5] is not None else text(row[1])

    rows = [o + (None,) for o in old]  # (flags, key, value, osversion, hwcap, name of a new row)
    _check_order([text(row[1]) for row in old], source)
    # New strings go after the old ones; each key shares its value's bytes (a basename).
    blob = bytearray()
    new = {}  # row -> its value
    seen = set()
    for e in entries:
        key, value = e.key.encode(), e.value.encode()
        if not value.endswith(b"/" + key):
            raise CacheError(f"{source}: new entry {e.key!r} is not its path's basename")
        if (value, e.flags) in seen:
            continue
        _check_order([key], source)
        seen.add((value, e.flags))
        new[(e.flags, len(blob) + len(value) - len(key), len(blob), e.osversion, e.hwcap, key)] = value
        blob += value + b"\0"
    if all((found := _lookup(rows, row[5], row[0], name)) and text(found[2]) == value
           for row, value in new.items()):
        return data  # the loader finds every one already (a restarted container's cache)
    for row in sorted(new, key=_SortKey):
        at = _insertion_point(rows, row, name)
        end = at
        while end < len(rows) and libcmp(name(rows[end]), row[5]) == 0:
            end += 1
        # An old entry identical to the new one (a restarted container's) is dropped.
        rows[at:end] = [row] + [r for r in rows[at:end] if r[5] is not None or r[4] or r[0] != row[0]
                                or text(r[2]) != new[row]]
    for row in new:
        if _lookup(rows, row[5], row[0], name) is not row:
            raise CacheError(f"{source}: the loader would not find the new entry {row[5]!r}")
    merged = [(*r[:5], r[5] is not None) for r in rows]

    delta = (len(merged) - nlibs) * 24  # every old string moves by the table's growth
    new_base = strings_end + delta
    table = bytearray()
    for flags, key, value, osversion, hwcap, is_new in merged:
        if is_new:
            key, value = key + new_base, value + new_base
        else:
            key, value = key + delta, value + delta
        table += struct.pack("=iIIIQ", flags, key, value, osversion, hwcap)
    header = bytearray(data[:_NEW_HEADER_SIZE])
    struct.pack_into("=II", header, 20, len(merged), len_strings + len(blob))
    body = bytes(header) + bytes(table) + data[strings_start:strings_end] + bytes(blob)
    if not sections:
        struct.pack_into("=I", header, 32, 0)
        return bytes(header) + body[_NEW_HEADER_SIZE:]
    ext_at = -(-len(body) // 4) * 4
    shift = ext_at - ext_offset
    tail = bytearray(data[ext_offset:])
    for index, (tag, offset, size) in sections:
        struct.pack_into("=I", tail, 8 + 16 * index + 8, offset + shift)
        if tag == _TAG_GLIBC_HWCAPS:
            at = offset - ext_offset
            for j in range(at, at + size, 4):
                (string_at,) = struct.unpack_from("=I", tail, j)
                struct.pack_into("=I", tail, j, string_at + delta)
    struct.pack_into("=I", header, 32, ext_at)
    return bytes(header) + body[_NEW_HEADER_SIZE:] + bytes(ext_at - len(body)) + bytes(tail)


def _insertion_point(rows: list, row: tuple, name) -> int:
    """The first index whose entry does not sort before ``row`` (binary search; the table is sorted)."""
    low, high = 0, len(rows)
    while low < high:
        middle = (low + high) // 2
        if _precedes(rows[middle], name, row):
            low = middle + 1
        else:
            high = middle
    return low


def _lookup(rows: list, key: bytes, flags: int, name):
    """The row glibc's ``search_cache`` picks for ``key`` (hwcap-free entries), or None."""
    low, high = 0, len(rows) - 1
    while low <= high:
        middle = (low + high) // 2
        order = libcmp(key, name(rows[middle]))
        if order == 0:
            while middle > 0 and libcmp(key, name(rows[middle - 1])) == 0:
                middle -= 1
            for row in rows[middle:]:
                if libcmp(key, name(row)):
                    return None
                if row[0] == flags and row[4] == 0:
                    return row
            return None
        if order < 0:
            low = middle + 1
        else:
            high = middle - 1
    return None


def _extensions(data: bytes, offset: int, strings_start: int, strings_end: int,
                source: str) -> list[tuple[int, tuple[int, int, int]]]:
    """The extension sections as (index, (tag, offset, size)), each checked to be read by glibc as it is moved.

    glibc's ``cache_extension_load`` ignores every extension at a misaligned
    directory, takes the last section of a tag when one repeats, and drops a
    glibc-hwcaps section that is empty or misaligned; it allows sections
    anywhere in the file, overlapping each other. The patch moves each
    section and rewrites the string offsets in a glibc-hwcaps one, so it
    takes only what it moves exactly: after the directory, inside the file,
    one of each known tag, none overlapping another, a glibc-hwcaps section
    glibc would use, its names inside the string table.
    """
    if offset == 0:
        if data[strings_end:].strip(b"\0"):
            raise CacheError(f"{source}: data after the string table but no extension")
        return []
    if offset % 4 or offset < strings_end or offset + 8 > len(data) or data[strings_end:offset].strip(b"\0"):
        raise CacheError(f"{source}: extension directory out of place")
    magic, count = struct.unpack_from("=II", data, offset)
    if magic != _EXTENSION_MAGIC or count > _MAX_EXTENSIONS or offset + 8 + 16 * count > len(data):
        raise CacheError(f"{source}: bad extension directory")
    out = []
    spans = []
    for index in range(count):
        tag, _, at, size = struct.unpack_from("=IIII", data, offset + 8 + 16 * index)
        if at < offset + 8 + 16 * count or at + size > len(data):
            raise CacheError(f"{source}: extension section out of place")
        if tag not in (_TAG_GENERATOR, _TAG_GLIBC_HWCAPS):
            raise CacheError(f"{source}: unknown extension {tag}")
        if any(tag == other for _, (other, _, _) in out):
            raise CacheError(f"{source}: extension {tag} twice (glibc reads only the last)")
        if any(at < end and begin < at + size for begin, end in spans):
            raise CacheError(f"{source}: extension sections overlap")
        if tag == _TAG_GLIBC_HWCAPS:
            if not size or size % 4 or at % 4:
                raise CacheError(f"{source}: bad glibc-hwcaps extension")
            for (name,) in struct.iter_unpack("=I", data[at:at + size]):
                if not strings_start <= name < strings_end:
                    raise CacheError(f"{source}: glibc-hwcaps name outside the string table")
        spans.append((at, at + size))
        out.append((index, (tag, at, size)))
    return out


def _check_order(names: list[bytes], source: str) -> None:
    """Refuse names the loader's binary search may not find the same way in a longer table.

    The search (glibc's ``search_cache``) keeps finding every old name after
    rows are inserted only where the table is sorted (descending by
    :func:`libcmp`) and the order is a real one: a run of ten or more digits
    wraps in C's ``int`` and can make it cyclic.
    """
    if b"0" * 10 in b"\0".join(names).translate(_DIGITS):
        raise CacheError(f"{source}: a name with a run of ten or more digits")
    for a, b in zip(names, names[1:]):
        if a != b and libcmp(a, b) < 0:
            raise CacheError(f"{source}: entries out of the loader's order ({a!r} before {b!r})")


_DIGITS = bytes(48 if 48 <= c <= 57 else c for c in range(256))  # every digit -> '0'


def _precedes(row: tuple, name, new: tuple) -> bool:
    """Whether ``row`` sorts before the ``new`` row in ldconfig's order (``new`` from a folder scanned first).

    By name, descending as glibc's ``_dl_cache_libcmp`` orders (the loader's
    binary search relies on it), then flags descending, glibc-hwcaps entries
    first, then legacy hwcap bits descending.
    """
    order = libcmp(name(row), new[5])
    if order:
        return order > 0
    if row[0] != new[0]:
        return row[0] > new[0]
    if (row[4] >> 32) & ~_ISA_LEVEL_MASK == _HWCAP_EXTENSION:
        return True
    return row[4] > new[4]


class _SortKey:
    """Orders new rows as :func:`_precedes` orders them against old ones."""

    __slots__ = ("row",)

    def __init__(self, row: tuple):
        self.row = row

    def __lt__(self, other: "_SortKey") -> bool:
        a, b = self.row, other.row
        order = libcmp(a[5], b[5])
        if order:
            return order > 0
        return a[0] > b[0]


def libcmp(a: bytes, b: bytes) -> int:
    """glibc's ``_dl_cache_libcmp``: runs of digits compare as numbers (C ``int``, wrapping), bytes as signed chars."""
    if a == b:
        return 0
    # Skip the common prefix (its length from the first differing bit of the two as integers, in
    # C), back to the start of a digit run it ends in: the walk below is then at the same place
    # in both, as glibc's would be.
    size = min(len(a), len(b))
    low = size - ((int.from_bytes(a[:size], "big") ^ int.from_bytes(b[:size], "big")).bit_length() + 7) // 8
    while low and 48 <= a[low - 1] <= 57:
        low -= 1
    i = j = low
    while i < len(a):
        ca = a[i]
        cb = b[j] if j < len(b) else 0
        if 48 <= ca <= 57:
            if not 48 <= cb <= 57:
                return 1
            va, i = _number(a, i)
            vb, j = _number(b, j)
            if va != vb:
                return _int32(va - vb)
        elif 48 <= cb <= 57:
            return -1
        elif ca != cb:
            return _signed(ca) - _signed(cb)
        else:
            i += 1
            j += 1
    return 0 - _signed(b[j] if j < len(b) else 0)


def _signed(c: int) -> int:
    """A byte as C's ``char`` on x86 (signed): glibc orders a byte over 127 before NUL."""
    return c - 256 if c > 127 else c


def _number(s: bytes, i: int) -> tuple[int, int]:
    value = 0
    while i < len(s) and 48 <= s[i] <= 57:
        value = _int32(value * 10 + s[i] - 48)
        i += 1
    return value, i


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value

