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
from dataclasses import dataclass
from typing import IO, Union

from nvct.errors import NvctError

__all__ = ["ElfInfo", "read"]

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

PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]


@dataclass(frozen=True)
class ElfInfo:
    """What :func:`read` learns from one ELF file."""

    elf_class: int  # 32 or 64
    machine: str  # 'x86_64', 'i386', 'aarch64', ... or 'unknown'
    soname: str | None
    needed: tuple[str, ...]
    abi_tag: tuple[int, int, int] | None  # Linux ABI tag, e.g. (3, 2, 0)


def read(path: PathOrFile, *, name: str | None = None) -> ElfInfo:
    """Read ``path``, or an open binary file (e.g. one opened safely under a
    container root; ``name`` then labels it in errors).

    Raises :class:`~nvct.errors.NvctError` for anything that is not a
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
