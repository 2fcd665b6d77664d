"""cgroup v2 device programs through the ``bpf(2)`` system call (ctypes, no dependency).

Under cgroup v2 a container's device access is decided by the
``BPF_PROG_TYPE_CGROUP_DEVICE`` programs attached to its cgroup. runc and
crun attach theirs with ``BPF_F_ALLOW_MULTI``: every attached program must
allow an access, so a second program that allows the GPU cannot help while the
runtime's still denies it. nvct therefore rewrites the runtime's program (and
systemd's, made for the runtime's cgroup driver; :func:`runtime_made`): it
loads a copy of it with a short prefix that allows exactly the injected char
devices and otherwise falls through to the unchanged original instructions,
and swaps it in atomically (``BPF_F_REPLACE``). Everything the runtime allowed
or denied keeps its meaning. Any other program on the cgroup (an
administrator's or a security agent's policy) is never rewritten: one that
denies an injected device (:func:`verdict`) makes the grant fail with one
line naming it. Nothing is pinned: the kernel frees the programs with the
cgroup when the container is deleted. See docs/cgroups.md.

No ``setrlimit(RLIMIT_MEMLOCK)``: kernels since 5.11 charge BPF memory to the
memory cgroup.
"""

from __future__ import annotations

import ctypes
import os
import struct

from nvct.linux.libc import libc as _libc

TYPE_CHECKING = False  # typing and platform import re: this runs on every legacy hook start
if TYPE_CHECKING:
    from typing import Iterable, Sequence

_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}

# commands
_PROG_LOAD, _PROG_ATTACH, _PROG_GET_NEXT_ID, _PROG_GET_FD_BY_ID, _OBJ_GET_INFO_BY_FD, _PROG_QUERY = \
    5, 8, 11, 13, 15, 16
PROG_TYPE_CGROUP_DEVICE = 15
ATTACH_CGROUP_DEVICE = 6
F_ALLOW_OVERRIDE, F_ALLOW_MULTI, F_REPLACE = 1, 2, 4
#: The name of every program nvct loads (bpftool prog shows it)
PROGRAM_NAME = "nvct_devices"

#: systemd's device programs (DeviceAllow=, which runc's and crun's systemd drivers set)
SYSTEMD_NAME = "sd_devices"

# instruction opcodes used by the prefix and checked in copied programs
_LDX_W = 0x61        # dst = *(u32 *)(src + off)
_JNE_K = 0x55        # if dst != imm goto +off
_MOV64_K = 0xB7      # dst = imm
_AND32_K = 0x54      # dst &= imm (32 bit)
_RSH32_K = 0x74      # dst >>= imm (32 bit)
_EXIT = 0x95
_CALL = 0x85
_LD_IMM64 = 0x18

#: bpf_cgroup_dev_ctx: access_type (low 16 bits: type, high 16: access), major, minor
_DEV_CHAR = 2



class BpfError(OSError):
    """A bpf(2) call failed; str() is one line naming the step."""


def _bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    nr = _SYSCALL.get(os.uname().machine)
    if nr is None:
        raise BpfError(f"{what}: bpf(2) number unknown on {os.uname().machine}")
    result = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), attr, ctypes.c_long(len(attr)))
    if result < 0:
        errno = ctypes.get_errno()
        raise BpfError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _attr(size: int, fmt: str, *values) -> ctypes.Array:
    buf = ctypes.create_string_buffer(size)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One eBPF instruction (little-endian hosts: dst in the low nibble)."""
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def allow_prefix(devices: Sequence[tuple[int, int]]) -> bytes:
    """Instructions that return 1 (allow) for char ``major:minor`` in ``devices``, any access.

    For any other device they fall through to the instruction after them with
    r1 (the context) untouched, which is where the runtime's program starts.
    """
    body: list[bytes] = []
    for major, minor in devices:  # a miss jumps to the next rule
        body += [insn(_JNE_K, 4, off=3, imm=major), insn(_JNE_K, 5, off=2, imm=minor),
                 insn(_MOV64_K, 0, imm=1), insn(_EXIT)]
    head = [insn(_LDX_W, 2, 1, 0), insn(_AND32_K, 2, imm=0xFFFF),
            insn(_LDX_W, 4, 1, 4), insn(_LDX_W, 5, 1, 8),
            insn(_JNE_K, 2, off=len(body), imm=_DEV_CHAR)]
    return b"".join(head + body)


#: How every device program runc, crun and systemd compile starts (crun's is "taken from
#: systemd", runc's the same): type -> r2, access -> r3, major -> r4, minor -> r5.
RUNTIME_HEAD = b"".join(insn(*i) for i in ((_LDX_W, 2, 1, 0), (_AND32_K, 2, 0, 0, 0xFFFF), (_LDX_W, 3, 1, 0),
                                            (_RSH32_K, 3, 0, 0, 16), (_LDX_W, 4, 1, 4), (_LDX_W, 5, 1, 8)))


def runtime_made(programs: Sequence[tuple[str, bytes]]) -> list[int]:
    """The indexes, among the cgroup's own ``programs`` ((name, instructions) in attach order),
    of those the runtime made: nvct extends these and no other.

    The runtime attaches its program when it creates the cgroup, before any
    hook runs, so it comes first of its kind: the first program that starts
    with :data:`RUNTIME_HEAD` (runc and crun load theirs without a name) is
    the runtime's. systemd's (named ``sd_devices``, same head) is made from
    the same spec for the runtime's systemd driver, and nvct's own copies
    (``nvct_devices``) replaced one of these: both count too. Where none
    matches (a runtime compiling programs another way) the first attached is
    the runtime's. Everything else was attached by someone else.
    """
    made, runtime = [], False
    for index, (name, code) in enumerate(programs):
        if name == PROGRAM_NAME or name == SYSTEMD_NAME and code.startswith(RUNTIME_HEAD):
            made.append(index)
        elif not runtime and code.startswith(RUNTIME_HEAD):
            made.append(index)
            runtime = True
    return made or [0][:len(programs)]


_ALU_OPS = {
    0x00: lambda a, b, bits: a + b, 0x10: lambda a, b, bits: a - b, 0x20: lambda a, b, bits: a * b,
    0x30: lambda a, b, bits: a // b if b else 0, 0x40: lambda a, b, bits: a | b,
    0x50: lambda a, b, bits: a & b, 0x60: lambda a, b, bits: a << (b & (bits - 1)),
    0x70: lambda a, b, bits: a >> (b & (bits - 1)), 0x80: lambda a, b, bits: -a,
    0x90: lambda a, b, bits: a % b if b else a, 0xA0: lambda a, b, bits: a ^ b, 0xB0: lambda a, b, bits: b,
    0xC0: lambda a, b, bits: _signed(a, bits) >> (b & (bits - 1)),
}
_JUMPS = {
    0x10: lambda a, b, bits: a == b, 0x20: lambda a, b, bits: a > b, 0x30: lambda a, b, bits: a >= b,
    0x40: lambda a, b, bits: bool(a & b), 0x50: lambda a, b, bits: a != b,
    0x60: lambda a, b, bits: _signed(a, bits) > _signed(b, bits),
    0x70: lambda a, b, bits: _signed(a, bits) >= _signed(b, bits), 0xA0: lambda a, b, bits: a < b,
    0xB0: lambda a, b, bits: a <= b, 0xC0: lambda a, b, bits: _signed(a, bits) < _signed(b, bits),
    0xD0: lambda a, b, bits: _signed(a, bits) <= _signed(b, bits),
}
_CONTEXT = object()  # r1 at entry: the struct bpf_cgroup_dev_ctx, 12 bytes
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def verdict(code: bytes, major: int, minor: int, access: int, kind: int = _DEV_CHAR) -> bool | None:
    """Whether the device program ``code`` allows ``access`` to ``major:minor``, run as the kernel runs it.

    The kernel has no test run for device programs, so nvct follows the
    instructions itself: ALU, jumps, loads from the context, 64-bit
    constants. None where the program does more (helpers, maps, the stack):
    then nvct cannot tell.
    """
    context = struct.pack("<III", (access << 16) | kind, major, minor)
    regs: list = [0] * 11
    regs[1] = _CONTEXT
    count, pc = len(code) // 8, 0
    for _ in range(1 << 16):  # the verifier bounds every program; this bounds a bad copy
        if not 0 <= pc < count:
            return None
        op, registers, off, imm = struct.unpack_from("<BBhi", code, pc * 8)
        dst, src, cls = registers & 15, registers >> 4, op & 7
        if dst > 10 or src > 10:
            return None
        if cls in (4, 7):  # ALU (32 bit), ALU64
            bits = 64 if cls == 7 else 32
            mask = (1 << bits) - 1
            alu = _ALU_OPS.get(op & 0xF0)
            a, b = regs[dst], regs[src] if op & 8 else imm & mask
            if op & 0xF0 == 0xB0:  # a move: the old value does not matter
                a = 0
            if op & 0xF0 == 0xB0 and b is _CONTEXT and cls == 7 and not off:
                regs[dst] = _CONTEXT  # a copy of the context pointer
            elif alu is None or off or a is _CONTEXT or b is _CONTEXT:
                return None  # byte swaps, sign-extending moves, pointer arithmetic
            else:
                regs[dst] = alu(a & mask, b & mask, bits) & mask
        elif cls == 1 and op & 0xE0 == 0x60:  # LDX MEM
            size = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}[op & 0x18]
            if regs[src] is not _CONTEXT or off < 0 or off + size > len(context):
                return None
            regs[dst] = int.from_bytes(context[off:off + size], "little")
        elif op == _LD_IMM64 and not src and pc + 1 < count:
            regs[dst] = (imm & 0xFFFFFFFF) | (struct.unpack_from("<i", code, pc * 8 + 12)[0] & 0xFFFFFFFF) << 32
            pc += 1
        elif cls in (5, 6):  # JMP, JMP32
            kind_op = op & 0xF0
            if kind_op == 0x90 and cls == 5:
                result = regs[0]
                return None if result is _CONTEXT else bool(result & 1)
            if kind_op == 0x00:
                pc += (off if cls == 5 else imm) + 1
                continue
            test = _JUMPS.get(kind_op)
            bits = 64 if cls == 5 else 32
            mask = (1 << bits) - 1
            a, b = regs[dst], regs[src] if op & 8 else imm & 0xFFFFFFFFFFFFFFFF
            if test is None or a is _CONTEXT or b is _CONTEXT:
                return None  # a call, or a pointer compared
            if test(a & mask, b & mask, bits):
                pc += off
        else:
            return None  # stores (the stack), atomics, legacy packet loads
        pc += 1
    return None


def _check_copyable(code: bytes) -> None:
    """Refuse a program whose dumped form is not loadable again (helper calls, maps)."""
    for i in range(0, len(code), 8):
        op = code[i]
        if op == _CALL or op == _LD_IMM64 and (code[i + 1] >> 4):
            raise BpfError("the attached device program calls helpers or uses maps; "
                           "nvct cannot extend it")


class Program:
    """A device program attached to a cgroup, opened by id."""

    def __init__(self, prog_id: int):
        self.id = prog_id
        self.name = ""
        self.fd = _bpf(_PROG_GET_FD_BY_ID, _attr(16, "<I", prog_id), f"open device program {prog_id}")

    def instructions(self) -> bytes:
        """The instructions as the kernel holds them (``name`` is set on the way)."""
        info = ctypes.create_string_buffer(256)
        _bpf(_OBJ_GET_INFO_BY_FD, _attr(16, "<IIQ", self.fd, len(info), ctypes.addressof(info)),
             f"read device program {self.id}")
        self.name = info.raw[64:80].split(b"\0", 1)[0].decode("ascii", "replace")
        length = struct.unpack_from("<I", info, 20)[0]
        code = ctypes.create_string_buffer(length)
        info = ctypes.create_string_buffer(256)
        struct.pack_into("<IQ", info, 20, length, 0)
        struct.pack_into("<Q", info, 32, ctypes.addressof(code))
        _bpf(_OBJ_GET_INFO_BY_FD, _attr(16, "<IIQ", self.fd, len(info), ctypes.addressof(info)),
             f"read device program {self.id}")
        return code.raw[:length]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def load(code: bytes, name: str = PROGRAM_NAME) -> int:
    """Load a cgroup device program; the fd. The verifier's last line goes into the error."""
    insns = ctypes.create_string_buffer(code, len(code))
    license = ctypes.create_string_buffer(b"Apache-2.0")

    def attempt(log: ctypes.Array | None) -> int:
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<IIQQIIQII16sII", attr, 0, PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                         ctypes.addressof(insns), ctypes.addressof(license),
                         1 if log is not None else 0, len(log) if log is not None else 0,
                         ctypes.addressof(log) if log is not None else 0, 0, 0,
                         name.encode()[:15], 0, ATTACH_CGROUP_DEVICE)
        return _bpf(_PROG_LOAD, attr, "load device program")

    try:
        return attempt(None)
    except BpfError as first:
        log = ctypes.create_string_buffer(1 << 16)
        try:
            fd = attempt(log)
        except BpfError:
            lines = [ln for ln in log.value.decode(errors="replace").splitlines() if ln.strip()]
            raise BpfError(first.errno, f"{first.strerror}" + (f" (verifier: {lines[-1]})" if lines else "")) from None
        return fd


def query(cgroup_fd: int) -> tuple[int, list[int]]:
    """(attach flags, ids of the device programs attached to the cgroup itself)."""
    count = 64
    ids = (ctypes.c_uint32 * count)()
    attr = _attr(40, "<IIIIQI", cgroup_fd, ATTACH_CGROUP_DEVICE, 0, 0, ctypes.addressof(ids), count)
    _bpf(_PROG_QUERY, attr, "query device programs")
    flags, = struct.unpack_from("<I", attr, 12)
    n, = struct.unpack_from("<I", attr, 24)
    return flags, list(ids[:n])


def attach(cgroup_fd: int, prog_fd: int, flags: int, replace_fd: int = 0) -> None:
    _bpf(_PROG_ATTACH, _attr(24, "<IIIII", cgroup_fd, prog_fd, ATTACH_CGROUP_DEVICE, flags, replace_fd),
         "attach device program")


class PolicyError(BpfError):
    """A program the runtime did not attach denies a device nvct grants; str() names it."""


def _policy_check(cgroup_dir: str, program: Program, code: bytes, wanted: Sequence[tuple[int, int]]) -> bool:
    """Raise :class:`PolicyError` if ``program`` denies reading or writing one of ``wanted``;
    False where it cannot be followed (:func:`verdict`), True where it allows them all."""
    for major, minor in wanted:
        for access, letters in ((ACC_READ, "r"), (ACC_WRITE, "w"), (ACC_READ | ACC_WRITE, "rw")):
            allowed = verdict(code, major, minor, access)
            if allowed is None:
                return False
            if not allowed:
                raise PolicyError(
                    f"device program {program.id} ({program.name or 'unnamed'}) on {cgroup_dir}, attached "
                    f"by someone other than the runtime, denies c {major}:{minor} {letters}: a device "
                    "policy nvct does not override")
    return True


def allow_char_devices(cgroup_dir: str, devices: Iterable[tuple[int, int]]) -> list[str]:
    """Let ``cgroup_dir`` open char ``devices`` (major, minor) with rwm, keeping its other rules.

    The runtime's device programs (:func:`runtime_made`) are each replaced
    by a copy that allows ``devices`` first; the swap is atomic per program,
    and on any failure the programs already swapped get their originals
    back. Every other program is left as it is: one that denies one of
    ``devices`` raises :class:`PolicyError` before anything changes. With no
    program attached, the cgroup (as far as its own attachments go) already
    allows every device and nothing is changed. Returns a line for each
    other program whose verdict nvct could not follow (left as it is).
    """
    wanted = sorted(set(devices))
    if not wanted:
        return []
    cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    opened: list[Program] = []
    done: list[tuple[int, int, int]] = []  # (new fd, old fd, flags) swapped so far
    new_fds: list[int] = []
    unknown: list[str] = []
    try:
        flags, ids = query(cg)
        prefix = allow_prefix(wanted)
        for prog_id in ids:
            opened.append(Program(prog_id))
        codes = [p.instructions() for p in opened]
        made = runtime_made([(p.name, code) for p, code in zip(opened, codes)])
        for index, (program, code) in enumerate(zip(opened, codes)):
            if index not in made and not _policy_check(cgroup_dir, program, code, wanted):
                unknown.append(f"device program {program.id} ({program.name or 'unnamed'}) on {cgroup_dir} "
                               "is not the runtime's and does more than nvct can follow; left as it is")
        try:
            for index in made:
                old, code = opened[index], codes[index]
                _check_copyable(code)
                new = load(prefix + code)
                new_fds.append(new)
                if flags & F_ALLOW_MULTI:
                    attach(cg, new, F_ALLOW_MULTI | F_REPLACE, old.fd)
                else:  # a single program: attaching with the same flags replaces it
                    attach(cg, new, flags)
                done.append((new, old.fd, flags))
        except BaseException:
            for new, old_fd, f in reversed(done):
                try:
                    if f & F_ALLOW_MULTI:
                        attach(cg, old_fd, F_ALLOW_MULTI | F_REPLACE, new)
                    else:
                        attach(cg, old_fd, f)
                except OSError:
                    pass
            raise
    finally:
        for fd in new_fds:
            os.close(fd)
        for p in opened:
            p.close()
        os.close(cg)
    return unknown


def loaded_named(name: str) -> list[int]:
    """Ids of the loaded BPF programs called ``name`` (tests and doctor: nothing left behind)."""
    found: list[int] = []
    current = 0
    while True:
        attr = _attr(16, "<I", current)
        try:
            _bpf(_PROG_GET_NEXT_ID, attr, "list programs")
        except BpfError:
            return found
        current, = struct.unpack_from("<I", attr, 4)
        try:
            prog = Program(current)
        except BpfError:
            continue  # freed meanwhile
        try:
            info = ctypes.create_string_buffer(256)
            _bpf(_OBJ_GET_INFO_BY_FD, _attr(16, "<IIQ", prog.fd, len(info), ctypes.addressof(info)),
                 f"read program {current}")
            if info.raw[64:80].split(b"\0", 1)[0] == name.encode()[:15]:
                found.append(current)
        finally:
            prog.close()
