"""nvct.bpf against the real kernel: a cgroup v2 device program extended, never loosened."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

from nvct import bpf

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
    script = f'echo $$ > {cgroup}/cgroup.procs; for p in "$@"; do if (exec 3<"$p") 2>&-; then echo ok; else echo no; fi; done'
    out = subprocess.run(["/bin/sh", "-c", script, "sh", *paths], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _attach(cgroup: str, code: bytes) -> None:
    fd = bpf.load(code, "nvct_test")
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


@needs_cgroup2
def test_every_attached_program_is_extended(cgroup):
    _attach(cgroup, ALLOW_MEM_READ)
    _attach(cgroup, DENY_ALL)
    assert _opens(cgroup, "/dev/null") == ["no"]
    bpf.allow_char_devices(cgroup, [(1, 3)])
    assert _opens(cgroup, "/dev/null", "/dev/zero") == ["ok", "no"]


@needs_cgroup2
def test_a_cgroup_without_programs_is_left_alone(cgroup):
    bpf.allow_char_devices(cgroup, [(195, 0)])
    cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert bpf.query(cg)[1] == []
    finally:
        os.close(cg)


def test_a_program_the_verifier_refuses_is_one_line():
    with pytest.raises(bpf.BpfError, match="load device program: .*verifier"):
        bpf.load(bpf.insn(0x95))  # r0 never set
