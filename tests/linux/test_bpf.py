"""nvct.linux.bpf against the real kernel: a cgroup v2 device program extended, never loosened."""

from __future__ import annotations

import os
import secrets
import stat
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.linux import bpf
from tests.support.fixtures import skip

UNIFIED = next((p for p in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
                if os.path.exists(f"{p}/cgroup.procs") and not os.path.exists(f"{p}/devices.list")), None)
needs_cgroup2 = pytest.mark.skipif(os.geteuid() != 0 or UNIFIED is None, reason="needs root and a cgroup2 mount")

DENY_ALL = bpf.insn(0xB7, 0, imm=0) + bpf.insn(0x95)
#: allows char 1:* (null, zero, ...) only for reading: what a runtime's filter might say
ALLOW_MEM_READ = b"".join([
    bpf.insn(0x61, 2, 1, 0), bpf.insn(0x54, 2, imm=0xFFFF), bpf.insn(0x61, 3, 1, 0), bpf.insn(0x74, 3, imm=16),
    bpf.insn(0x61, 4, 1, 4), bpf.insn(0x55, 2, off=4, imm=2), bpf.insn(0x55, 4, off=3, imm=1),
    bpf.insn(0x55, 3, off=2, imm=2), bpf.insn(0xB7, 0, imm=1), bpf.insn(0x95), bpf.insn(0xB7, 0, imm=0),
    bpf.insn(0x95)])


def test_prefix_is_four_instructions_per_device_after_a_five_instruction_head():
    assert len(bpf.allow_prefix([(195, 0), (195, 255)])) == (5 + 8) * 8


@pytest.fixture
def cgroup():
    path = f"{UNIFIED}/nvct-bpf-test-{secrets.token_hex(4)}"
    os.mkdir(path)
    try:
        yield path
    finally:
        os.rmdir(path)


def _opens(cgroup: str, *paths: str) -> list[str]:
    script = (f'echo $$ > {cgroup}/cgroup.procs; '
              'for p in "$@"; do if (exec 3<"$p") 2>&-; then echo ok; else echo no; fi; done')
    out = subprocess.run(["/bin/sh", "-c", script, "sh", *paths], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _attach(cgroup: str, code: bytes, name: str = "nvct_test") -> None:
    fd = bpf.load(code, name)
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bpf.attach(cg, fd, bpf.F_ALLOW_MULTI)
    finally:
        os.close(cg)
        os.close(fd)


@needs_cgroup2
def test_allowed_device_opens_and_everything_else_keeps_the_runtimes_verdict(cgroup):
    _attach(cgroup, ALLOW_MEM_READ)
    assert _opens(cgroup, "/dev/null", "/dev/zero", "/dev/ptmx") == ["ok", "ok", "no"]
    bpf.allow_char_devices(cgroup, [(1, 3)])
    assert _opens(cgroup, "/dev/null", "/dev/zero", "/dev/ptmx") == ["ok", "ok", "no"]
    ptmx = os.stat("/dev/ptmx").st_rdev
    bpf.allow_char_devices(cgroup, [(os.major(ptmx), os.minor(ptmx))])
    assert _opens(cgroup, "/dev/null", "/dev/zero", "/dev/ptmx") == ["ok", "ok", "ok"]
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags, ids = bpf.query(cg)
    finally:
        os.close(cg)
    assert flags == bpf.F_ALLOW_MULTI and len(ids) == 1  # replaced, not added


def _programs(cgroup: str) -> list[tuple[int, str]]:
    """(id, name) of the programs attached to ``cgroup``, in attach order."""
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = []
        for prog_id in bpf.query(cg)[1]:
            program = bpf.Program(prog_id)
            try:
                program.instructions()
                out.append((prog_id, program.name))
            finally:
                program.close()
        return out
    finally:
        os.close(cg)


def _compile(rules, default: bool = False) -> bytes:
    """A device program as runc and crun compile a spec's rules: the shared head, then per rule
    (type, major, minor, access, allow) a block that returns its verdict on a match."""
    code = [bpf.RUNTIME_HEAD]
    for kind, major, minor, access, allow in rules:
        bits = sum({"r": 2, "w": 4, "m": 1}[c] for c in access)
        checks = []
        if kind != "a":
            checks.append([bpf.insn(0x55, 2, imm=1 if kind == "b" else 2)])
        if bits != 7:
            checks.append([bpf.insn(0xBC, 1, 3), bpf.insn(0x54, 1, imm=bits), bpf.insn(0x5D, 1, 3)])
        if major is not None:
            checks.append([bpf.insn(0x55, 4, imm=major)])
        if minor is not None:
            checks.append([bpf.insn(0x55, 5, imm=minor)])
        flat = [i for check in checks for i in check]
        for at, ins in enumerate(flat):
            if ins[0] in (0x55, 0x5D):  # skip to the next rule: past the rest and the verdict
                ins = ins[:2] + struct.pack("<h", len(flat) - at - 1 + 2) + ins[4:]
            code.append(ins)
        code += [bpf.insn(0xB7, 0, imm=int(allow)), bpf.insn(0x95)]
        if not flat:  # a wildcard: what follows could never run (the verifier refuses it), as crun stops
            return b"".join(code)
    code += [bpf.insn(0xB7, 0, imm=int(default)), bpf.insn(0x95)]
    return b"".join(code)


ALLOW_ALL = bpf.insn(0xB7, 0, imm=1) + bpf.insn(0x95)
#: a runtime's program: char 1:* readable, the rest denied (runc's and crun's shape)
RUNTIME_MEM_READ = _compile([("c", 1, None, "r", True)])


@needs_cgroup2
def test_only_the_runtimes_program_is_extended(cgroup):
    _attach(cgroup, RUNTIME_MEM_READ, "")
    _attach(cgroup, ALLOW_ALL, "site_allow")
    (runtime, _), policy = _programs(cgroup)
    assert bpf.allow_char_devices(cgroup, [(1, 3)]) == []
    after = _programs(cgroup)
    assert after[0][0] != runtime and after[0][1] == bpf.PROGRAM_NAME  # swapped in place
    assert after[1] == policy  # never rewritten
    assert _opens(cgroup, "/dev/null", "/dev/zero", "/dev/ptmx") == ["ok", "ok", "no"]


@needs_cgroup2
@pytest.mark.parametrize("policy", [
    _compile([("c", 1, 3, "rwm", False)], default=True),  # denies exactly the granted device
    _compile([("c", 1, None, "w", False)], default=True),  # denies writing it
    DENY_ALL,
])
def test_a_policy_that_denies_a_granted_device_fails_naming_it_and_changes_nothing(cgroup, policy):
    _attach(cgroup, RUNTIME_MEM_READ, "")
    _attach(cgroup, policy, "site_deny")
    before = _programs(cgroup)
    with pytest.raises(bpf.PolicyError) as info:
        bpf.allow_char_devices(cgroup, [(195, 0), (1, 3)])
    message = str(info.value)
    assert "\n" not in message and f"device program {before[1][0]} (site_deny) on {cgroup}" in message
    assert "denies c 1:3" in message and "policy nvct does not override" in message
    assert _programs(cgroup) == before


@needs_cgroup2
def test_systemds_program_is_the_runtimes_too(cgroup):
    _attach(cgroup, _compile([], default=False), bpf.SYSTEMD_NAME)
    _attach(cgroup, RUNTIME_MEM_READ, "")
    bpf.allow_char_devices(cgroup, [(1, 3)])
    assert [name for _, name in _programs(cgroup)] == [bpf.PROGRAM_NAME, bpf.PROGRAM_NAME]
    assert _opens(cgroup, "/dev/null", "/dev/zero") == ["ok", "no"]


@needs_cgroup2
def test_a_runtime_nvct_does_not_know_is_the_first_program(cgroup):
    _attach(cgroup, ALLOW_MEM_READ, "")  # not the shared head
    _attach(cgroup, ALLOW_ALL, "site_allow")
    policy = _programs(cgroup)[1]
    bpf.allow_char_devices(cgroup, [(1, 3)])
    assert _programs(cgroup)[1] == policy
    assert _opens(cgroup, "/dev/null", "/dev/zero") == ["ok", "ok"]


@needs_cgroup2
def test_a_policy_nvct_cannot_follow_is_left_alone_and_reported(cgroup):
    stack = bpf.insn(0x62, 10, off=-4, imm=1) + bpf.insn(0x61, 0, 10, -4) + bpf.insn(0x57, 0, imm=1) + bpf.insn(0x95)
    _attach(cgroup, RUNTIME_MEM_READ, "")
    _attach(cgroup, stack, "site_stack")
    policy = _programs(cgroup)[1]
    notes = bpf.allow_char_devices(cgroup, [(1, 3)])
    assert len(notes) == 1 and f"device program {policy[0]} (site_stack)" in notes[0]
    assert _programs(cgroup)[1] == policy
    assert _opens(cgroup, "/dev/null") == ["ok"]


_RULE = st.tuples(st.sampled_from("cba"), st.sampled_from([None, 1, 7, 195]), st.sampled_from([None, 0, 3]),
                  st.sampled_from(["r", "w", "m", "rw", "rm", "wm", "rwm"]), st.booleans())
_PROBE = """
import errno, os, sys
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write(str(os.getpid()))
for path in sys.argv[2:]:
    for flags in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR):
        try:
            os.close(os.open(path, flags | os.O_NONBLOCK))
            print("allowed")
        except OSError as e:
            print("denied" if e.errno == errno.EPERM else "allowed")
"""


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Device nodes of every kind, major and minor the rules name, and some they do not."""
    if os.geteuid() != 0:
        skip("needs root (mknod)")
    folder = tmp_path_factory.mktemp("nodes")
    out = []
    for kind, mode in (("c", stat.S_IFCHR), ("b", stat.S_IFBLK)):
        for major in (1, 7, 195, 240):
            for minor in (0, 3, 9):
                path = folder / f"{kind}{major}_{minor}"
                os.mknod(path, mode | 0o666, os.makedev(major, minor))
                out.append((str(path), kind, major, minor))
    return out


@needs_cgroup2
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rules=st.lists(_RULE, max_size=6), default=st.booleans())
def test_the_verdict_nvct_reads_is_the_kernels(cgroup, nodes, rules, default):
    """A runtime-compiled program: the kernel's answer for opening a node for reading, writing or
    both (EPERM: denied) is what :func:`nvct.linux.bpf.verdict` reads in its instructions."""
    _verdicts_match_the_kernel(cgroup, nodes, _compile(rules, default))


@needs_cgroup2
def test_a_cgroup_without_programs_is_left_alone(cgroup):
    bpf.allow_char_devices(cgroup, [(195, 0)])
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert bpf.query(cg)[1] == []
    finally:
        os.close(cg)


@pytest.mark.root  # loading a program needs CAP_BPF
def test_a_program_the_verifier_refuses_is_one_line():
    with pytest.raises(bpf.BpfError, match="load device program: .*verifier"):
        bpf.load(bpf.insn(0x95))  # r0 never set


def _verdicts_match_the_kernel(cgroup: str, nodes, code: bytes) -> None:
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    fd = bpf.load(code, "nvct_test")
    try:
        bpf.attach(cg, fd, bpf.F_ALLOW_MULTI)
        out = subprocess.run([sys.executable, "-c", _PROBE, cgroup, *(n[0] for n in nodes)],
                             capture_output=True, text=True, check=True).stdout.split()
        expected = []
        for _, kind, major, minor in nodes:
            for access in (bpf.ACC_READ, bpf.ACC_WRITE, bpf.ACC_READ | bpf.ACC_WRITE):
                allowed = bpf.verdict(code, major, minor, access, kind=1 if kind == "b" else 2)
                assert allowed is not None
                expected.append("allowed" if allowed else "denied")
        assert out == expected
    finally:
        bpf._bpf(9, bpf._attr(24, "<IIIII", cg, fd, bpf.ATTACH_CGROUP_DEVICE, 0, 0), "detach")  # BPF_PROG_DETACH
        os.close(fd)
        os.close(cg)


I = bpf.insn  # noqa: E741 - one letter, as the listings it builds read
#: Programs written other ways than a runtime compiles them (an agent's, a hand-written policy)
HANDWRITTEN = {
    "jset: no writes": [I(0x61, 3, 1, 0), I(0x77, 3, imm=16), I(0x45, 3, off=2, imm=4),  # r3 & WRITE
                        I(0xB7, 0, imm=1), I(0x95), I(0xB7, 0, imm=0), I(0x95)],
    "jmp32 range: majors 190-199 denied": [I(0x61, 4, 1, 4), I(0xA6, 4, off=3, imm=190), I(0x26, 4, off=2, imm=199),
                                           I(0xB7, 0, imm=0), I(0x95), I(0xB7, 0, imm=1), I(0x95)],
    "ld_imm64 and a 64-bit compare": [I(0x61, 2, 1, 4), I(0x67, 2, imm=32), I(0x18, 3, imm=0), I(0, imm=195),
                                      I(0x5D, 2, 3, off=2),  # major << 32 != 195 << 32
                                      I(0xB7, 0, imm=0), I(0x95), I(0xB7, 0, imm=1), I(0x95)],
    "alu: xor, arsh, signed compare": [I(0x61, 5, 1, 8), I(0xA7, 5, imm=2), I(0x67, 5, imm=62), I(0xC7, 5, imm=62),
                                       I(0xC5, 5, off=2, imm=0),  # (minor ^ 2) as a signed 2-bit field < 0
                                       I(0xB7, 0, imm=1), I(0x95), I(0xB7, 0, imm=0), I(0x95)],
    "a copied context pointer": [I(0xBF, 6, 1), I(0x61, 4, 6, 4), I(0x55, 4, off=2, imm=195),
                                 I(0xB7, 0, imm=0), I(0x95), I(0xB7, 0, imm=1), I(0x95)],
}


@needs_cgroup2
@pytest.mark.parametrize("name", sorted(HANDWRITTEN))
def test_the_verdict_of_a_handwritten_program_is_the_kernels(cgroup, nodes, name):
    _verdicts_match_the_kernel(cgroup, nodes, b"".join(HANDWRITTEN[name]))
