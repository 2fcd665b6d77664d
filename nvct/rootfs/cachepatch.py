"""Adding entries to a container's ld.so.cache exactly as ldconfig would, without running it.

ldconfig rescans every folder of the image and runs as image-facing code
(nvct.rootfs.sandbox); for the driver's libraries alone, patching the
image's cache (glibc >= 2.32's format, read by nvct.discover.ldcache) is
enough and cheaper. Where the patch could differ from what ldconfig writes,
:class:`~nvct.base.errors.CacheError` says why and ldconfig runs instead.
"""

from __future__ import annotations

import os
import stat
import struct

from nvct.base.errors import CacheError, ContainerError
from nvct.discover.ldcache import (
    MAX_FILE_SIZE,
    MAX_STRING,
    NATIVE,
    NEW_HEADER_SIZE,
    NEW_MAGIC,
    Entry,
    check_table,
    new_byte_order,
)
from nvct.linux import elf

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

    from nvct.rootfs.root import Rootfs

CACHE_PATH = "/etc/ld.so.cache"


def patched_cache(root: Rootfs, libraries: Sequence[str],
                  host_files: dict[str, str] | None = None) -> tuple[bytes, bytes] | None:
    """The root's ld cache and that cache with ``libraries`` added as ldconfig would; None where only ldconfig can.

    Each path becomes the entry ldconfig makes for it: its basename and the
    flags ldconfig gives it (:func:`_library_entry`; the file is read in the
    root, or on the host through ``host_files``). The image's cache must be
    one glibc >= 2.32 wrote and :func:`add` can patch exactly
    (the loader's own search finding every new entry afterwards, and every
    old one as before); anything else (no cache, the old format, a cache
    glibc may read otherwise once patched, a path that is not an x86-64,
    aarch64 or i386 ELF library) is left to ldconfig, which writes the whole cache
    afresh; a debug line says why. Reads only through the root, runs nothing.
    Skipping ldconfig also skips its rescan of the image's folders: entries
    the image's cache lacks stay missing, as they were before the start.
    """
    if not root.exists(CACHE_PATH):
        return None
    try:
        data = root.read_file(CACHE_PATH, limit=MAX_FILE_SIZE + 1)
        entries = []
        for path in libraries:
            if host_files is not None:
                fd = _open_host_file(host_files.get(path))
            else:
                fd = root.open(path)
            found = _library_entry(fd, path) if fd >= 0 else None
            if found is None:
                return None
            entries.append(found)
        return data, add(data, entries, source=CACHE_PATH)
    except CacheError as e:
        from nvct.base.log import logger

        logger.debug("%s: left to ldconfig", e)
        return None
    except ContainerError:
        return None


def _open_host_file(path: str | None) -> int:
    """An fd on a host file (the driver's; trusted like every host path nvct mounts), else -1."""
    if path is None:
        return -1
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return -1


#: e_machine of a little-endian 64-bit library -> the flags its architecture's ldconfig gives every one:
#: e_machine of a little-endian 64-bit library -> the flags its architecture's ldconfig gives every one:
#: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64 (x86-64: "libc6,x86-64"), | FLAG_AARCH64_LIB64 (arm64: "libc6,AArch64").
_FLAGS_64 = {62: 0x0303, 183: 0x0A03}
_FLAGS_LIBC6 = 0x0003  # FLAG_ELF_LIBC6: an i386 library that needs libc.so.6
_ET_DYN, _EM_386 = 3, 3


def _library_entry(fd: int, path: str) -> Entry | None:
    """The cache entry ldconfig (glibc >= 2.33: no OS version) makes for the library open on ``fd``.

    x86-64 and aarch64 libraries always get their architecture's flags; an
    i386 one gets libc6's when it needs ``libc.so.6`` (every driver library
    does). Anything else: None.
    Closes ``fd``.
    """
    try:
        head = elf.header(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        if head is None or not head.little_endian or head.type != _ET_DYN:
            return None
        if head.elf_class == 64 and head.machine in _FLAGS_64:
            flags = _FLAGS_64[head.machine]
        elif head.elf_class == 32 and head.machine == _EM_386 and "libc.so.6" in elf.dynamic(fd)[1]:
            flags = _FLAGS_LIBC6
        else:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    return Entry(path.rsplit("/", 1)[1], path, flags)


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
    if not data.startswith(NEW_MAGIC):
        raise CacheError(f"{source}: not a new-format cache")
    if len(data) < NEW_HEADER_SIZE or new_byte_order(data[28] & 3, source) != NATIVE:
        raise CacheError(f"{source}: foreign byte order or truncated header")
    nlibs, len_strings = struct.unpack_from("=II", data, 20)
    (ext_offset,) = struct.unpack_from("=I", data, 32)
    strings_start = check_table(data, NEW_HEADER_SIZE, nlibs, 24, source)
    strings_end = strings_start + len_strings
    if strings_end > len(data):
        raise CacheError(f"{source}: string table past end")
    # Every string then ends inside the table, as it did before the new strings followed it.
    if len_strings and data[strings_end - 1]:
        raise CacheError(f"{source}: string table does not end in a NUL")
    old = list(struct.iter_unpack("=iIIIQ", memoryview(data)[NEW_HEADER_SIZE:strings_start]))
    for _, key, value, _, _ in old:
        if not (strings_start <= key < strings_end and strings_start <= value < strings_end):
            raise CacheError(f"{source}: entry string outside the string table")
    sections = _extensions(data, ext_offset, strings_start, strings_end, source)

    def text(at: int) -> bytes:
        stop = data.find(b"\0", at, min(at + MAX_STRING, strings_end))
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
    header = bytearray(data[:NEW_HEADER_SIZE])
    struct.pack_into("=II", header, 20, len(merged), len_strings + len(blob))
    body = bytes(header) + bytes(table) + data[strings_start:strings_end] + bytes(blob)
    if not sections:
        struct.pack_into("=I", header, 32, 0)
        return bytes(header) + body[NEW_HEADER_SIZE:]
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
    return bytes(header) + body[NEW_HEADER_SIZE:] + bytes(ext_at - len(body)) + bytes(tail)


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
    out: list = []
    spans: list = []
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
