"""The few ELF facts nvct needs about a shared library.

Driver discovery must tell a 64-bit ``libcuda.so.1`` from an i386 one, learn
a library's SONAME and dependencies, and see its ``NT_GNU_ABI_TAG`` (the
minimum kernel it was built for). Like ``ldconfig``, this reads the program
headers (``PT_DYNAMIC``, ``PT_NOTE``), which survive section stripping.

pyelftools is imported only when a file is read: most nvct commands never
need it and it costs tens of milliseconds to import.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections import namedtuple

from nvct.base.errors import NvctError

__all__ = ["ElfInfo", "read", "abi_tag", "cuda_compat_note"]

# Bounds on loops driven by header fields, so a corrupt file cannot keep us
# busy: real libraries have a few dozen dynamic tags and a handful of notes.
_MAX_DYNAMIC_TAGS = 65536
_MAX_NOTES = 256

_NOTE_HEADER_SIZE = 12  # namesz, descsz, type: 32-bit words in both classes
_ABI_TAG_SIZE = 16  # os, major, minor, tiny: four 32-bit words

# e_machine -> name, by ELF class where the class changes the ABI's name.
_MACHINES = {
    ("EM_X86_64", 64): "x86_64",
    ("EM_X86_64", 32): "x32",
    ("EM_386", 32): "i386",
    ("EM_AARCH64", 64): "aarch64",
    ("EM_ARM", 32): "arm",
    ("EM_PPC64", 64): "ppc64",
    ("EM_PPC", 32): "ppc",
    ("EM_S390", 64): "s390x",
    ("EM_S390", 32): "s390",
    ("EM_RISCV", 64): "riscv64",
    ("EM_RISCV", 32): "riscv32",
    ("EM_LOONGARCH", 64): "loongarch64",
}

TYPE_CHECKING = False  # typing and dataclasses cost ~10 ms: abi_tag() runs in cdi generate
if TYPE_CHECKING:
    from typing import IO, Union

    PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]


class ElfInfo(namedtuple("_ElfInfo", "elf_class machine soname needed abi_tag")):
    """What :func:`read` learns from one ELF file.

    ``elf_class`` 32 or 64; ``machine`` 'x86_64', 'i386', 'aarch64', ... or
    'unknown'; ``soname`` or None; ``needed`` a tuple; ``abi_tag`` the Linux
    ABI tag, e.g. (3, 2, 0), or None.
    """

    __slots__ = ()


def read(path: PathOrFile, *, name: str | None = None) -> ElfInfo:
    """Read ``path``, or an open binary file (e.g. one opened safely under a
    container root; ``name`` then labels it in errors).

    Raises :class:`~nvct.base.errors.NvctError` for anything that is not a
    readable, well-formed ELF file.
    """
    if hasattr(path, "read"):
        return _read_stream(path, name or getattr(path, "name", "<stream>"))
    label = name or os.fspath(path)
    try:
        # Non-blocking, so that a FIFO planted in an image cannot hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NvctError(f"{label}: not a regular file")
            return _read_stream(f, label)
    except OSError as e:
        raise NvctError(f"{label}: cannot read: {e.strerror or e}") from None


def _read_stream(stream: IO[bytes], label: str) -> ElfInfo:
    from elftools.elf.elffile import ELFFile

    try:
        stream = _Bounded(stream)
        if stream.read(4) != b"\x7fELF":
            raise NvctError(f"{label}: not an ELF file")
        stream.seek(0)
        elf = ELFFile(stream)
        elf_class = elf.elfclass
        soname, needed = _dynamic(elf)
        return ElfInfo(
            elf_class=elf_class,
            machine=_MACHINES.get((elf["e_machine"], elf_class), "unknown"),
            soname=soname,
            needed=needed,
            abi_tag=_abi_tag(elf),
        )
    except NvctError:
        raise
    except OSError as e:
        raise NvctError(f"{label}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001
        # pyelftools is not hardened: damage surfaces as ELFError but also
        # as construct, lookup, overflow, attribute or recursion errors.
        raise NvctError(f"{label}: corrupt ELF file ({_one_line(e)})") from None


def abi_tag(path: str) -> tuple[int, int, int] | None:
    """Only the Linux ``NT_GNU_ABI_TAG`` of ``path``, read straight from its program headers.

    ``cdi generate`` and graphics containers check libnvidia-tls's tag; this
    reads a few hundred bytes with ``os.pread`` instead of importing
    pyelftools (~30 ms). Same bounds as :func:`read`; raises NvctError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise NvctError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NvctError(f"{path}: not a regular file")
        return _notes_abi_tag(fd, st.st_size, path)
    except OSError as e:
        raise NvctError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _notes_abi_tag(fd: int, size: int, label: str) -> tuple[int, int, int] | None:
    import struct

    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise NvctError(f"{label}: not an ELF file")
    end = "<" if head[5] == 1 else ">"
    if head[4] == 2:
        if len(head) < 64:
            raise NvctError(f"{label}: corrupt ELF file (truncated header)")
        phoff, = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
        phdr, min_entsize = end + "I4xQ16xQ8xQ", 56  # type, offset, filesz, align
    else:
        phoff, = struct.unpack_from(end + "I", head, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
        phdr, min_entsize = end + "II8xI8xI", 32
    if phentsize < min_entsize or phoff + phentsize * phnum > size:
        raise NvctError(f"{label}: corrupt ELF file (program headers outside the file)")
    table = os.pread(fd, phentsize * phnum, phoff)
    for i in range(phnum):
        if struct.unpack_from(end + "I", table, i * phentsize)[0] != 4:  # PT_NOTE
            continue
        _, offset, filesz, align = struct.unpack_from(phdr, table, i * phentsize)
        if offset >= size or filesz > size - offset:
            continue
        found = _abi_note(os.pread(fd, min(filesz, 1 << 16), offset), end, 8 if align == 8 else 4)
        if found is not None:
            return found
    return None


def _abi_note(data: bytes, end: str, align: int) -> tuple[int, int, int] | None:
    import struct

    pos = 0
    for _ in range(_MAX_NOTES):
        if pos + _NOTE_HEADER_SIZE > len(data):
            return None
        namesz, descsz, kind = struct.unpack_from(end + "III", data, pos)
        name_at = pos + _NOTE_HEADER_SIZE
        desc_at = name_at + -(-namesz // align) * align
        if desc_at + descsz > len(data):
            return None
        if kind == 1 and data[name_at:name_at + namesz] == b"GNU\0" and descsz >= _ABI_TAG_SIZE:
            os_, major, minor, tiny = struct.unpack_from(end + "IIII", data, desc_at)
            if os_ == 0:  # ELF_NOTE_OS_LINUX
                return (major, minor, tiny)
        pos = desc_at + -(-descsz // align) * align
    return None


class _Bounded:
    """A stream whose reads never ask for more than the file holds.

    pyelftools passes size fields from the file straight to ``read()``, and
    a buffered file allocates the requested size before reading.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._size = stream.seek(0, os.SEEK_END)
        stream.seek(0)

    def read(self, size: int = -1) -> bytes:
        left = max(self._size - self._stream.tell(), 0)
        return self._stream.read(left if size is None or size < 0 else min(size, left))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_SET and not 0 <= offset <= self._size:
            raise ValueError(f"offset {offset} outside the file")
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


def _dynamic(elf) -> tuple[str | None, tuple[str, ...]]:
    soname = None
    needed = []
    for segment in elf.iter_segments("PT_DYNAMIC"):
        limit = min(segment["p_filesz"] // elf.structs.Elf_Dyn.sizeof(), _MAX_DYNAMIC_TAGS)
        for tag in itertools.islice(segment.iter_tags(), limit):
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_SONAME":
                soname = tag.soname
    return soname, tuple(needed)


def _abi_tag(elf) -> tuple[int, int, int] | None:
    for segment in elf.iter_segments("PT_NOTE"):
        segment_end = segment["p_offset"] + segment["p_filesz"]
        for note in itertools.islice(segment.iter_notes(), _MAX_NOTES):
            desc_start = note["n_offset"] + _NOTE_HEADER_SIZE + -(-note["n_namesz"] // 4) * 4
            if (
                note["n_type"] == "NT_GNU_ABI_TAG"
                and note["n_name"] == "GNU"
                and note["n_descsz"] >= _ABI_TAG_SIZE
                and desc_start + note["n_descsz"] <= segment_end
                and note["n_desc"]["abi_os"] == "ELF_NOTE_OS_LINUX"
            ):
                desc = note["n_desc"]
                return (desc["abi_major"], desc["abi_minor"], desc["abi_tiny"])
    return None


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text[:200] or type(error).__name__


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
            desc = _named_note(os.pread(fd, length, offset), end, max(align, 4), _CUDA_COMPAT_NOTE_NAME)
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


def _named_note(data: bytes, end: str, align: int, name: str) -> bytes | None:
    """The description of the first note in ``data`` called ``name`` (NULs around it ignored)."""
    import struct

    pos = 0
    for _ in range(_MAX_NOTES):
        if pos + _NOTE_HEADER_SIZE > len(data):
            return None
        namesz, descsz, _kind = struct.unpack_from(end + "III", data, pos)
        name_at = pos + _NOTE_HEADER_SIZE
        desc_at = name_at + -(-namesz // align) * align
        if desc_at + descsz > len(data):
            return None
        if data[name_at:name_at + namesz].strip(b"\0") == name:
            return data[desc_at:desc_at + descsz]
        pos = desc_at + -(-descsz // align) * align
    return None


def soname(path: str) -> str | None:
    """The SONAME of the 64-bit little-endian shared library at ``path``, or None; never raises.

    For container starts (WSL2's driver store, Jetson's CSV lists), where
    pyelftools' import would cost more than the start itself: ``struct`` on
    the program headers (``PT_LOAD`` to map addresses, ``PT_DYNAMIC`` for
    ``DT_SONAME`` and ``DT_STRTAB``), as ldconfig reads them.
    """
    import struct

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        head = os.pread(fd, 64, 0)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01" or struct.unpack_from("<H", head, 16)[0] != 3:
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        if phentsize < 56 or phnum > 256:
            return None
        table = os.pread(fd, phentsize * phnum, phoff)
        loads, dynamic = [], None
        for i in range(len(table) // phentsize):
            ptype, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if ptype == 1:
                loads.append((vaddr, offset, filesz))
            elif ptype == 2:
                dynamic = (offset, min(filesz, 16 * _MAX_DYNAMIC_TAGS))
        if dynamic is None:
            return None
        data = os.pread(fd, dynamic[1], dynamic[0])
        strtab = name = None
        for i in range(len(data) // 16):
            tag, value = struct.unpack_from("<qQ", data, i * 16)
            if tag == 0:
                break
            if tag == 5:
                strtab = value
            elif tag == 14:
                name = value
        if strtab is None or name is None:
            return None
        at = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
        if at is None:
            return None
        raw = os.pread(fd, 4096, at + name).split(b"\0", 1)[0]
        return raw.decode("utf-8", "replace") or None
    except (OSError, struct.error):
        return None
    finally:
        os.close(fd)
