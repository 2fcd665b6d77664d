"""nvct's one ELF reader: the few facts it needs about a library or program.

Driver discovery must tell a 64-bit ``libcuda.so.1`` from an i386 one, learn
a library's SONAME and dependencies, and see its ``NT_GNU_ABI_TAG`` (the
minimum kernel it was built for); the ld cache patch needs an entry's flags,
the ldconfig sandbox a static executable, the toolkit a program's loader.
Like ``ldconfig``, this reads the program headers (``PT_DYNAMIC``,
``PT_NOTE``, ``PT_INTERP``), which survive section stripping, with
``os.pread``: no pyelftools, whose import alone costs ~30 ms, on the paths
that run on every container start. Files may come from a hostile image, so
every size read from one is bounded by the file.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import NvctError
from nvct.base.record import Record
from nvct.linux.elfnote import CUDA_COMPAT_SECTION, cuda_compat_note, notes

__all__ = ["ElfInfo", "Header", "read", "abi_tag", "soname", "header", "dynamic", "interpreter",
           "static_problem", "cuda_compat_note", "CUDA_COMPAT_SECTION"]

# Bounds on loops driven by header fields, so a corrupt file cannot keep us
# busy: real libraries have a few dozen dynamic tags and a handful of notes.
_MAX_DYNAMIC_TAGS = 65536
_MAX_STRING = 4096

_ABI_TAG_SIZE = 16  # os, major, minor, tiny: four 32-bit words

_ET_EXEC, _ET_DYN = 2, 3
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP, _PT_NOTE = 1, 2, 3, 4
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ, _DT_SONAME = 0, 1, 5, 10, 14

# (e_machine, ELF class) -> name; the class changes the ABI's name for some.
_MACHINES = {
    (62, 64): "x86_64",
    (62, 32): "x32",
    (3, 32): "i386",
    (183, 64): "aarch64",
    (40, 32): "arm",
    (21, 64): "ppc64",
    (20, 32): "ppc",
    (22, 64): "s390x",
    (22, 32): "s390",
    (243, 64): "riscv64",
    (243, 32): "riscv32",
    (258, 64): "loongarch64",
}

TYPE_CHECKING = False  # typing and dataclasses cost ~10 ms, collections ~2 ms: this runs on container starts
if TYPE_CHECKING:
    from typing import IO, Union

    PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]


class ElfInfo(Record):
    """What :func:`read` learns from one ELF file.

    ``elf_class`` 32 or 64; ``machine`` 'x86_64', 'i386', 'aarch64', ... or
    'unknown'; ``soname`` or None; ``needed`` a tuple; ``abi_tag`` the Linux
    ABI tag, e.g. (3, 2, 0), or None.
    """

    __slots__ = ("elf_class", "machine", "soname", "needed", "abi_tag")
    elf_class: int
    machine: str
    soname: str | None
    needed: tuple[str, ...]
    abi_tag: tuple[int, int, int] | None


class Header(Record):
    """The ELF header's identity: class 32 or 64, byte order, ``e_type`` and ``e_machine`` (numbers)."""

    __slots__ = ("elf_class", "little_endian", "type", "machine")
    elf_class: int
    little_endian: bool
    type: int
    machine: int


class _Bad(Exception):
    """Why headers cannot be read. ``kind``: 'magic' (not ELF at all), 'short' (under an
    ELF32 header), 'ident' (bad class or byte order), 'truncated' (a cut ELF64 header),
    'entsize' (program header entries too small), 'outside' (table beyond the file)."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


class _Source:
    """``pread`` on an fd or a seekable binary stream; reads stop at the file's end."""

    def __init__(self, fd: int = -1, stream: IO[bytes] | None = None):
        self._fd, self._stream = fd, stream
        self.size = os.fstat(fd).st_size if stream is None else stream.seek(0, os.SEEK_END)

    def pread(self, size: int, offset: int) -> bytes:
        size = max(min(size, self.size - offset), 0)
        if self._stream is None:
            return os.pread(self._fd, size, offset) if size else b""
        self._stream.seek(offset)
        return self._stream.read(size) if size else b""


class _Elf:
    """The ELF header and program headers of one file; :class:`_Bad` if they cannot be read.

    ``segments``: (p_type, p_offset, p_vaddr, p_filesz, p_align) each, read
    only by :meth:`load_segments`, so that the header can be judged first.
    """

    def __init__(self, src: _Source):
        import struct

        self.src = src
        head = src.pread(64, 0)
        if len(head) < 4 or head[:4] != b"\x7fELF":
            raise _Bad("magic", "not an ELF file")
        if len(head) < 52:
            raise _Bad("short", "truncated header")
        if head[4] not in (1, 2) or head[5] not in (1, 2):
            raise _Bad("ident", "bad ELF class or byte order")
        self.end = end = "<" if head[5] == 1 else ">"
        self.elf_class = 64 if head[4] == 2 else 32
        e_type, machine = struct.unpack_from(end + "HH", head, 16)
        self.header = Header(self.elf_class, head[5] == 1, e_type, machine)
        if self.elf_class == 64:
            if len(head) < 64:
                raise _Bad("truncated", "truncated header")
            self._phoff, = struct.unpack_from(end + "Q", head, 32)
            self.phentsize, self.phnum = struct.unpack_from(end + "HH", head, 54)
            self._phdr, self._min_entsize = end + "I4xQQ8xQ8xQ", 56
        else:
            self._phoff, = struct.unpack_from(end + "I", head, 28)
            self.phentsize, self.phnum = struct.unpack_from(end + "HH", head, 42)
            self._phdr, self._min_entsize = end + "III4xI8xI", 32
        self.segments: list[tuple[int, int, int, int, int]] = []

    def load_segments(self) -> _Elf:
        import struct

        if self.phentsize < self._min_entsize:
            raise _Bad("entsize", "program header entries too small")
        if self._phoff + self.phentsize * self.phnum > self.src.size:
            raise _Bad("outside", "program headers outside the file")
        table = self.src.pread(self.phentsize * self.phnum, self._phoff)
        self.segments = [struct.unpack_from(self._phdr, table, i * self.phentsize) for i in range(self.phnum)]
        return self

    def dynamic(self, strict: bool) -> tuple[str | None, tuple[str, ...]]:
        """(DT_SONAME, DT_NEEDED names) from ``PT_DYNAMIC``; damage raises :class:`_Bad` if ``strict``, else hides."""
        import struct

        found = [s for s in self.segments if s[0] == _PT_DYNAMIC]
        if not found:
            return None, ()
        _, offset, _, filesz, _ = found[-1]
        if offset > self.src.size or filesz > self.src.size - offset:
            if strict:
                raise _Bad("dynamic", "dynamic section outside the file")
            return None, ()
        entsize, fmt = (16, self.end + "qQ") if self.elf_class == 64 else (8, self.end + "iI")
        data = self.src.pread(min(filesz, entsize * _MAX_DYNAMIC_TAGS), offset)
        needed, strtab, strsz, name = [], None, None, None
        for tag, value in struct.iter_unpack(fmt, data[:len(data) // entsize * entsize]):
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                needed.append(value)
            elif tag == _DT_STRTAB:
                strtab = value
            elif tag == _DT_STRSZ:
                strsz = value
            elif tag == _DT_SONAME:
                name = value
        if name is None and not needed:
            return None, ()
        base = next((off + strtab - vaddr for kind, off, vaddr, size, _ in self.segments
                     if kind == _PT_LOAD and strtab is not None and vaddr <= strtab < vaddr + size), None)
        if base is None:
            if strict:
                raise _Bad("strtab", "string table outside the file")
            return None, ()
        strings = [self._string(base, at, strsz, strict) for at in [name, *needed] if at is not None]
        soname = strings.pop(0) if name is not None else None
        return soname, tuple(s for s in strings if s is not None)

    def _string(self, base: int, at: int, strsz: int | None, strict: bool) -> str | None:
        if (strsz is not None and at >= strsz) or base + at >= self.src.size:
            if strict:
                raise _Bad("strtab", "string outside the string table")
            return None
        return self.src.pread(_MAX_STRING, base + at).split(b"\0", 1)[0].decode("utf-8", "replace")

    def abi_tag(self) -> tuple[int, int, int] | None:
        for kind, offset, _, filesz, align in self.segments:
            if kind != _PT_NOTE or offset >= self.src.size or filesz > self.src.size - offset:
                continue
            for name, note_type, desc in notes(self.src.pread(min(filesz, 1 << 16), offset), self.end,
                                                8 if align == 8 else 4):
                if note_type == 1 and name == b"GNU\0" and len(desc) >= _ABI_TAG_SIZE:
                    import struct

                    os_, major, minor, tiny = struct.unpack_from(self.end + "IIII", desc)
                    if os_ == 0:  # ELF_NOTE_OS_LINUX
                        return (major, minor, tiny)
        return None


def _open(path: str | os.PathLike[str], label: str, *, nofollow: bool = False) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (os.O_NOFOLLOW if nofollow else 0)
    try:
        # Non-blocking, so that a FIFO planted in an image cannot hang us.
        fd = os.open(path, flags)
    except OSError as e:
        raise NvctError(f"{label}: cannot read: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NvctError(f"{label}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read(path: PathOrFile, *, name: str | None = None) -> ElfInfo:
    """Read ``path``, or an open binary file (e.g. one opened safely under a
    container root; ``name`` then labels it in errors).

    Raises :class:`~nvct.base.errors.NvctError` for anything that is not a
    readable, well-formed ELF file.
    """
    if not isinstance(path, (str, os.PathLike)):
        stream = path
        return _info(lambda: _Source(stream=stream), name or str(getattr(stream, "name", "<stream>")))
    label = name or os.fspath(path)
    fd = _open(path, label)
    try:
        return _info(lambda: _Source(fd), label)
    finally:
        os.close(fd)


def _info(source, label: str) -> ElfInfo:
    try:
        elf = _Elf(source()).load_segments()
        found_soname, needed = elf.dynamic(strict=True)
        return ElfInfo(
            elf_class=elf.elf_class,
            machine=_MACHINES.get((elf.header.machine, elf.elf_class), "unknown"),
            soname=found_soname,
            needed=needed,
            abi_tag=elf.abi_tag(),
        )
    except _Bad as e:
        if e.kind == "magic":
            raise NvctError(f"{label}: {e.reason}") from None
        raise NvctError(f"{label}: corrupt ELF file ({e.reason})") from None
    except OSError as e:
        raise NvctError(f"{label}: cannot read: {e.strerror or e}") from None


def abi_tag(path: str) -> tuple[int, int, int] | None:
    """Only the Linux ``NT_GNU_ABI_TAG`` of ``path`` (``cdi generate`` and graphics containers
    check libnvidia-tls's). Same bounds as :func:`read`; raises NvctError."""
    fd = _open(path, path)
    try:
        return _Elf(_Source(fd)).load_segments().abi_tag()
    except _Bad as e:
        if e.kind in ("magic", "short", "ident"):
            raise NvctError(f"{path}: not an ELF file") from None
        raise NvctError(f"{path}: corrupt ELF file ({e.reason})") from None
    except OSError as e:
        raise NvctError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def soname(path: str) -> str | None:
    """The SONAME of the 64-bit little-endian shared library at ``path``, or None; never raises.

    For container starts (WSL2's driver store, Jetson's CSV lists): ``PT_LOAD``
    maps ``DT_STRTAB``'s address to the file, as ldconfig reads it. A symlink
    at ``path`` is not followed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        elf = _Elf(_Source(fd))
        head = elf.header
        if (head.elf_class, head.little_endian, head.type) != (64, True, _ET_DYN) or elf.phnum > 256:
            return None
        return elf.load_segments().dynamic(strict=False)[0] or None
    except (_Bad, OSError):
        return None
    finally:
        os.close(fd)


def header(fd: int) -> Header | None:
    """The ELF header's identity of the file open on ``fd``, or None if it is not ELF."""
    try:
        return _Elf(_Source(fd)).header
    except _Bad:
        return None


def dynamic(fd: int) -> tuple[str | None, tuple[str, ...]]:
    """(SONAME, needed) of the ELF file open on ``fd``; damage hides what it touches.

    For an image's file: nothing read is trusted beyond these names.
    Raises OSError only.
    """
    try:
        elf = _Elf(_Source(fd))
        if elf.phnum > 256:
            return None, ()
        return elf.load_segments().dynamic(strict=False)
    except _Bad:
        return None, ()


def interpreter(path: str) -> str | None:
    """The ``PT_INTERP`` of the program at ``path`` (its ELF loader), or None for a static one.

    Raises NvctError for anything that is not a readable ELF file.
    """
    fd = _open(path, path)
    try:
        elf = _Elf(_Source(fd)).load_segments()
        for kind, offset, _, filesz, _ in elf.segments:
            if kind == _PT_INTERP:
                raw = elf.src.pread(min(filesz, _MAX_STRING), offset).split(b"\0", 1)[0]
                return raw.decode("utf-8", "replace") or None
        return None
    except _Bad as e:
        raise NvctError(f"{path}: {'not an ELF file' if e.kind == 'magic' else f'corrupt ELF file ({e.reason})'}") \
            from None
    except OSError as e:
        raise NvctError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def static_problem(fd: int) -> str | None:
    """Why the file open on ``fd`` is not a static ELF executable, or None if it is one.

    Static: it names no loader (``PT_INTERP``), so it loads nothing from
    wherever it runs (a chroot). One of 'not an ELF file', 'malformed ELF
    header', 'not an ELF executable', 'truncated ELF program headers',
    'dynamically linked'. Raises OSError only.
    """
    try:
        elf = _Elf(_Source(fd))
        if elf.header.type not in (_ET_EXEC, _ET_DYN) or elf.phnum == 0 or elf.phnum > 4096:
            return "not an ELF executable"
        elf.load_segments()
    except _Bad as e:
        return {"magic": "not an ELF file", "short": "not an ELF file", "entsize": "not an ELF executable",
                "outside": "truncated ELF program headers"}.get(e.kind, "malformed ELF header")
    if any(kind == _PT_INTERP for kind, *_ in elf.segments):
        return "dynamically linked"
    return None
