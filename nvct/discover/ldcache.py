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
NEW_MAGIC = b"glibc-ld.so.cache1.1"
NEW_HEADER_SIZE = 48

# Byte-order flag in the new header (glibc >= 2.33); 0 means "not recorded".
_ENDIAN_UNSET, _ENDIAN_INVALID, _ENDIAN_LITTLE, _ENDIAN_BIG = range(4)
NATIVE = "<" if sys.byteorder == "little" else ">"

# A path longer than PATH_MAX is corrupt; the bound also keeps each string
# search short so that hostile offsets cannot make parsing quadratic.
MAX_STRING = 4096
# Real caches are well under a megabyte; refuse to slurp a huge file.
MAX_FILE_SIZE = 16 * 1024 * 1024

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
            data = f.read(MAX_FILE_SIZE + 1)
    except OSError as e:
        raise CacheError(f"{source}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_FILE_SIZE:
        raise CacheError(f"{source}: larger than {MAX_FILE_SIZE} bytes")
    return parse(data, source=source)


def parse(data: bytes, *, source: str = "ld.so.cache") -> list[Entry]:
    """Parse cache bytes in either format; ``source`` names them in errors."""
    data = bytes(data)
    if data.startswith(NEW_MAGIC):
        return _parse_new(data, 0, source)
    if data.startswith(_OLD_MAGIC):
        return _parse_old(data, source)
    raise CacheError(f"{source}: bad magic, not an ld.so.cache file")


def _parse_old(data: bytes, source: str) -> list[Entry]:
    if len(data) < _OLD_HEADER_SIZE:
        raise CacheError(f"{source}: truncated header")
    (nlibs,) = struct.unpack_from(NATIVE + "I", data, 12)
    table_end = check_table(data, _OLD_HEADER_SIZE, nlibs, 12, source)
    # A compat cache embeds a new-format one after the table, aligned to
    # alignof(struct cache_file_new): 8 on 64-bit writers, 4 on 32-bit ones.
    for start in ((table_end + 7) & ~7, table_end):
        if data.startswith(NEW_MAGIC, start):
            return _parse_new(data, start, source)
    table = memoryview(data)[_OLD_HEADER_SIZE:table_end]
    string = _strings(data, table_end, source)
    return [
        Entry(string(key), string(value), flags)
        for flags, key, value in struct.iter_unpack(NATIVE + "iII", table)
    ]


def _parse_new(data: bytes, base: int, source: str) -> list[Entry]:
    if len(data) - base < NEW_HEADER_SIZE:
        raise CacheError(f"{source}: truncated header")
    order = new_byte_order(data[base + 28] & 3, source)
    (nlibs,) = struct.unpack_from(order + "I", data, base + 20)
    start = base + NEW_HEADER_SIZE
    table_end = check_table(data, start, nlibs, 24, source)
    table = memoryview(data)[start:table_end]
    string = _strings(data, base, source)
    return [
        Entry(string(key), string(value), flags, osversion, hwcap)
        for flags, key, value, osversion, hwcap in struct.iter_unpack(
            order + "iIIIQ", table
        )
    ]


def new_byte_order(flag: int, source: str) -> str:
    if flag == _ENDIAN_LITTLE:
        return "<"
    if flag == _ENDIAN_BIG:
        return ">"
    if flag == _ENDIAN_UNSET:
        return NATIVE
    raise CacheError(f"{source}: invalid byte-order flag in header")


def check_table(data: bytes, start: int, nlibs: int, size: int, source: str) -> int:
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
        end = data.find(b"\0", start, start + MAX_STRING)
        if end < 0:
            if start >= len(data):
                raise CacheError(f"{source}: string offset {offset} out of range")
            raise CacheError(f"{source}: unterminated string at offset {offset}")
        budget -= end - start
        if budget < 0:
            raise CacheError(f"{source}: strings overlap implausibly often")
        return data[start:end].decode("utf-8", "surrogateescape")

    return read
