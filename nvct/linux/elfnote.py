"""ELF notes: the bounded walk of a note table, and the CUDA compat note of a libcuda.

Part of the one ELF reader (nvct.linux.elf re-exports :func:`cuda_compat_note`):
the compat note has no segment of its own, so it is read from the section
headers, while every other fact comes from the program headers.
"""

from __future__ import annotations

import os

from nvct.base.errors import NvctError

_MAX_NOTES = 256
_NOTE_HEADER_SIZE = 12  # namesz, descsz, type: 32-bit words in both classes


def notes(data: bytes, end: str, align: int):
    """(name, type, description) of each note in ``data``, bounded."""
    import struct

    pos = 0
    for _ in range(_MAX_NOTES):
        if pos + _NOTE_HEADER_SIZE > len(data):
            return
        namesz, descsz, kind = struct.unpack_from(end + "III", data, pos)
        name_at = pos + _NOTE_HEADER_SIZE
        desc_at = name_at + -(-namesz // align) * align
        if desc_at + descsz > len(data):
            return
        yield data[name_at:name_at + namesz], kind, data[desc_at:desc_at + descsz]
        pos = desc_at + -(-descsz // align) * align


#: The section of a CUDA compat libcuda that names the driver branches, CUDA version and
#: device brands it supports: one note, name "NVIDIA Corporation", a JSON description.
CUDA_COMPAT_SECTION = b".note.cuda.fwd_compatibility"
_CUDA_COMPAT_NOTE_NAME = b"NVIDIA Corporation"
_SHT_NOTE = 7
_MAX_SECTIONS = 1 << 16
_MAX_NOTE_SIZE = 1 << 16


def cuda_compat_note(fd: int, label: str) -> dict | None:
    """The JSON of the ``.note.cuda.fwd_compatibility`` section of an open libcuda, or None.

    Read with ``os.pread`` from the section headers (the note has no segment of
    its own); the file is image-supplied, so every size is bounded. None when
    the file has no such note; NvctError when it is not ELF or the note is not
    the JSON object it should be.
    """
    import json
    import struct

    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 64, 0)
        if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
            raise NvctError(f"{label}: not an ELF file")
        end = "<" if head[5] == 1 else ">"
        if head[4] == 2:
            shoff, = struct.unpack_from(end + "Q", head, 40)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 58)
            shdr, min_entsize = end + "II8x8xQQ8xQ", 64  # name, type, offset, size, align
        else:
            shoff, = struct.unpack_from(end + "I", head, 32)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", head, 46)
            shdr, min_entsize = end + "II4x4xII8xI", 40
        if shoff == 0 or shnum == 0:
            return None  # no section headers (fully stripped): no note to read
        if shentsize < min_entsize or shnum > _MAX_SECTIONS or shoff + shentsize * shnum > size \
                or shstrndx >= shnum:
            raise NvctError(f"{label}: corrupt ELF file (section headers outside the file)")
        table = os.pread(fd, shentsize * shnum, shoff)
        sections = [struct.unpack_from(shdr, table, i * shentsize) for i in range(shnum)]
        _, _, str_off, str_size, _ = sections[shstrndx]
        if str_off > size or str_size > size - str_off:
            raise NvctError(f"{label}: corrupt ELF file (section names outside the file)")
        names = os.pread(fd, min(str_size, 1 << 20), str_off)
        for name_at, kind, offset, length, align in sections:
            if kind != _SHT_NOTE or names[name_at:name_at + len(CUDA_COMPAT_SECTION) + 1] \
                    != CUDA_COMPAT_SECTION + b"\0":
                continue
            if offset > size or length > size - offset or length > _MAX_NOTE_SIZE:
                raise NvctError(f"{label}: corrupt ELF file (CUDA compat note outside the file)")
            found = notes(os.pread(fd, length, offset), end, max(align, 4))
            desc = next((d for n, _, d in found if n.strip(b"\0") == _CUDA_COMPAT_NOTE_NAME), None)
            if desc is None:
                return None
            try:
                note = json.loads(desc.strip(b"\0").decode())
            except (UnicodeDecodeError, ValueError):
                raise NvctError(f"{label}: its CUDA compat note is not JSON") from None
            if not isinstance(note, dict):
                raise NvctError(f"{label}: its CUDA compat note is not a JSON object")
            return note
        return None
    except OSError as e:
        raise NvctError(f"{label}: cannot read: {e.strerror or e}") from None
