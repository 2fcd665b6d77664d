from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.base.errors import NvctError
from nvct.linux import elf
from nvct.linux.elf import ElfInfo
from tests.support.fixtures import skip

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

C_SOURCE = '#include <stdio.h>\nint f(void) { return puts("f"); }\n'
# A Linux 3.2.0 NT_GNU_ABI_TAG note, as glibc's crt files carry.
ABI_TAG_ASM = """\
\t.section .note.ABI-tag,"a",@note
\t.p2align 2
\t.long 4, 16, 1
\t.asciz "GNU"
\t.long 0, 3, 2, 0
\t.section .note.GNU-stack,"",@progbits
"""


def _build(directory: Path, name: str, *flags: str, abi_tag=False) -> Path:
    src = directory / "f.c"
    src.write_text(C_SOURCE)
    sources = [str(src)]
    if abi_tag:
        (directory / "tag.s").write_text(ABI_TAG_ASM)
        sources.append(str(directory / "tag.s"))
    out = directory / name
    cmd = ["gcc", "-shared", "-fPIC", "-o", str(out), *sources, *flags]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}: {result.stderr}")
    return out


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("elf")
    return {
        "tagged64": _build(
            d, "libtagged.so.1", "-Wl,-soname,libtagged.so.1", "-Wl,--no-as-needed", "-lm",
            abi_tag=True,
        ),
        "plain64": _build(d, "libplain.so", "-nostdlib"),
    }


@pytest.fixture(scope="module")
def libs32(tmp_path_factory):
    d = tmp_path_factory.mktemp("elf32")
    probe = subprocess.run(
        ["gcc", "-m32", "-shared", "-x", "c", "-o", str(d / "probe.so"), "-"],
        input=C_SOURCE, capture_output=True, text=True,
    )
    if probe.returncode != 0:
        skip("gcc -m32 cannot link (install gcc-multilib)")
    return {
        "tagged32": _build(d, "libtagged32.so.1", "-m32", "-Wl,-soname,libtagged32.so.1", abi_tag=True),
        "nostdlib32": _build(d, "libbare32.so.2", "-m32", "-nostdlib", "-Wl,-soname,libbare32.so.2"),
    }


def test_64bit_library_with_soname_needed_and_abi_tag(libs):
    info = elf.read(libs["tagged64"])
    assert info == ElfInfo(
        elf_class=64,
        machine="x86_64" if _host_is_x86_64() else info.machine,
        soname="libtagged.so.1",
        needed=("libm.so.6", "libc.so.6"),
        abi_tag=(3, 2, 0),
    )


def test_library_without_soname_needs_nothing(libs):
    info = elf.read(str(libs["plain64"]))
    assert (info.soname, info.needed, info.abi_tag) == (None, (), None)


def test_32bit_library(libs32):
    info = elf.read(libs32["tagged32"])
    assert (info.elf_class, info.machine) == (32, "i386")
    assert (info.soname, info.needed, info.abi_tag) == ("libtagged32.so.1", ("libc.so.6",), (3, 2, 0))


def test_32bit_library_without_libc(libs32):
    info = elf.read(libs32["nostdlib32"])
    assert (info.elf_class, info.machine, info.soname, info.needed) == (32, "i386", "libbare32.so.2", ())


def test_reads_an_open_file_named_by_the_caller(libs):
    with open(libs["tagged64"], "rb") as f:
        assert elf.read(f, name="/rootfs/lib/libtagged.so.1").soname == "libtagged.so.1"
    with pytest.raises(NvctError, match=r"^/rootfs/x: not an ELF file$"):
        elf.read(io.BytesIO(b"hello"), name="/rootfs/x")


# --- files that are not (whole) ELF libraries -----------------------------------


def test_text_file(tmp_path):
    path = tmp_path / "libfake.so"
    path.write_text("INPUT(libc.so.6)\n")
    with pytest.raises(NvctError, match=f"^{path}: not an ELF file$"):
        elf.read(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.so"
    path.write_bytes(b"")
    with pytest.raises(NvctError, match="not an ELF file"):
        elf.read(path)


@pytest.mark.parametrize("size", [4, 20, 63, 100, 1000])
def test_truncated_elf(libs, tmp_path, size):
    path = tmp_path / "cut.so"
    path.write_bytes(libs["tagged64"].read_bytes()[:size])
    with pytest.raises(NvctError, match=f"^{path}: corrupt ELF file"):
        elf.read(path)


def test_missing_file(tmp_path):
    with pytest.raises(NvctError, match="cannot read: No such file"):
        elf.read(tmp_path / "absent.so")


def test_directory(tmp_path):
    with pytest.raises(NvctError, match=f"^{tmp_path}: "):
        elf.read(tmp_path)


def test_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "libcuda.so.1"
    os.mkfifo(fifo)
    with pytest.raises(NvctError, match="not a regular file"):
        elf.read(fifo)


def test_pyelftools_is_imported_lazily():
    code = "import sys, nvct.linux.elf; assert 'elftools' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_huge_note_size_is_not_allocated(libs, tmp_path):
    """A note claiming a 4 GiB descriptor must not make us allocate it."""
    data = bytearray(libs["tagged64"].read_bytes())
    note = data.find(b"\x04\0\0\0\x10\0\0\0\x01\0\0\0GNU\0")
    assert note > 0
    data[note + 4 : note + 8] = b"\xff\xff\xff\xff"
    path = tmp_path / "hostile.so"
    path.write_bytes(bytes(data))
    info = elf.read(path)  # the broken note is ignored or rejected, never allocated
    assert info.abi_tag is None


# --- corrupt bytes: ElfInfo or NvctError, quickly ---------------------------------


@pytest.fixture(scope="module")
def sample(libs):
    return libs["tagged64"].read_bytes()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corruption_gives_info_or_error(sample, data):
    read_or_refuse(damage(sample, data))  # and within a second: tests/perf/test_linux.py


def damage(sample: bytes, data) -> bytes:
    damaged = bytearray(sample)
    window = data.draw(st.sampled_from([0x40 * 8, len(sample)]), label="window")
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        position = data.draw(st.integers(0, min(window, len(sample)) - 1))
        damaged[position] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans(), label="truncate"):
        damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    return bytes(damaged)


def read_or_refuse(damaged: bytes) -> None:
    try:
        info = elf.read(io.BytesIO(damaged), name="damaged.so")
    except NvctError as e:
        assert str(e).startswith("damaged.so: ") and "\n" not in str(e)
    else:
        assert info.elf_class in (32, 64)


def _host_is_x86_64() -> bool:
    return os.uname().machine == "x86_64"


def test_abi_tag_reads_the_same_tag_as_read_without_pyelftools(libs, libs32):
    for path in (*libs.values(), *libs32.values()):
        assert elf.abi_tag(str(path)) == elf.read(path).abi_tag
    code = (f"import sys, nvct.linux.elf; nvct.linux.elf.abi_tag({str(libs['tagged64'])!r}); "
            "assert 'elftools' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_abi_tag_of_corrupt_bytes_is_a_tag_none_or_error(sample, tmp_path, data):
    damaged = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        damaged[data.draw(st.integers(0, min(0x40 * 8, len(sample)) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "damaged.so"
    path.write_bytes(bytes(damaged[: data.draw(st.integers(0, len(damaged)))]))
    try:
        tag = elf.abi_tag(str(path))
    except NvctError as e:
        assert "\n" not in str(e)
    else:
        assert tag is None or len(tag) == 3


def test_aarch64_library(tmp_path):
    # Grace (arm64) drivers: EM_AARCH64 (183), read with the same program-header walk as x86-64.
    from nvct.simulate.native import compiler

    (tmp_path / "f.c").write_text(C_SOURCE)
    (tmp_path / "tag.s").write_text(ABI_TAG_ASM)
    out = tmp_path / "libarm.so.1"
    subprocess.run([*compiler("aarch64"), "-shared", "-fPIC", "-Wl,-soname,libarm.so.1", "-o", str(out),
                    str(tmp_path / "f.c"), str(tmp_path / "tag.s")], check=True, capture_output=True)
    assert elf.read(out) == ElfInfo(elf_class=64, machine="aarch64", soname="libarm.so.1",
                                    needed=("libc.so.6",), abi_tag=(3, 2, 0))
    assert elf.abi_tag(str(out)) == (3, 2, 0)


# --- the rest of the one reader: header, dynamic, interpreter, static_problem -------------


def _fd_of(path):
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def test_header_and_dynamic_of_a_32bit_library(libs32):
    fd = _fd_of(libs32["tagged32"])
    try:
        assert elf.header(fd) == elf.Header(elf_class=32, little_endian=True, type=3, machine=3)
        assert elf.dynamic(fd) == ("libtagged32.so.1", ("libc.so.6",))
    finally:
        os.close(fd)


def test_header_and_dynamic_of_what_is_not_elf(tmp_path):
    path = tmp_path / "libx.so"
    path.write_text("INPUT(-lc)\n")
    fd = _fd_of(path)
    try:
        assert (elf.header(fd), elf.dynamic(fd), elf.static_problem(fd)) == (None, (None, ()), "not an ELF file")
    finally:
        os.close(fd)


def test_interpreter_is_the_programs_loader_and_none_for_a_library(libs):
    loader = elf.interpreter(os.path.realpath(sys.executable))
    assert loader is not None and os.path.basename(loader).startswith("ld-linux")
    assert elf.interpreter(str(libs["plain64"])) is None
    with pytest.raises(NvctError, match="not an ELF file"):
        elf.interpreter(__file__)


def test_static_problem_tells_a_dynamic_program_from_a_static_one(libs, tmp_path):
    static = tmp_path / "static"
    (tmp_path / "m.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-static", "-o", str(static), str(tmp_path / "m.c")], check=True, capture_output=True)
    for path, problem in ((sys.executable, "dynamically linked"), (static, None), (libs["plain64"], None)):
        fd = _fd_of(os.path.realpath(path))
        try:
            assert elf.static_problem(fd) == problem, path
        finally:
            os.close(fd)


def test_reading_imports_no_pyelftools(libs):
    code = (f"import sys, nvct.linux.elf as e; e.read({str(libs['tagged64'])!r}); e.soname({str(libs['tagged64'])!r}); "
            "assert 'elftools' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_start_paths_never_raise_on_corrupt_bytes(sample, tmp_path, data):
    """soname, header, dynamic and static_problem read an image's files on container starts: never a traceback."""
    damaged = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        damaged[data.draw(st.integers(0, min(0x40 * 8, len(sample)) - 1))] = data.draw(st.integers(0, 255))
    path = tmp_path / "damaged.so"
    path.write_bytes(bytes(damaged[: data.draw(st.integers(0, len(damaged)))]))
    assert elf.soname(str(path)) is None or isinstance(elf.soname(str(path)), str)
    fd = _fd_of(path)
    try:
        elf.header(fd)
        found, needed = elf.dynamic(fd)
        assert found is None or isinstance(found, str)
        assert all(isinstance(n, str) for n in needed)
        assert elf.static_problem(fd) in (None, "not an ELF file", "malformed ELF header", "not an ELF executable",
                                          "truncated ELF program headers", "dynamically linked")
    finally:
        os.close(fd)
