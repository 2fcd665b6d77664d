"""The NVIDIA kernel module's files under /proc, read without opening a device.

On real hardware the first open of a GPU device node can stall for seconds,
so GPUs and MIG devices are enumerated from these text files only. ``root``
is the directory that stands for /proc (the host's, even when the driver
itself lives in a driver container).
"""

from __future__ import annotations

import os

from nvct.base.errors import DriverError
from nvct.base.record import Record

# No re here: with enum it costs ~5 ms on every container start. The parsers below
# match exactly what these did: r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)*)"
# (searched), r"^gi(\d+)$" and r"^ci(\d+)$" (\d and \s in their Unicode sense).
_KERNEL_MODULE = "Kernel Module"


class GpuInfo(Record):
    """One ``gpus/<bus>/information`` file."""
    __slots__ = ("bus_id", "model", "uuid", "minor", "excluded")
    _defaults = {"excluded": False}
    bus_id: str
    model: str
    uuid: str
    minor: int
    excluded: bool


class MigInstance(Record):
    """A MIG device as the caps tree shows it: GPU instance + compute instance."""
    __slots__ = ("gpu_minor", "gi", "ci")


    gpu_minor: int
    gi: int
    ci: int


def driver_version(root: str) -> str:
    """The kernel module's version from ``driver/nvidia/version``."""
    path = os.path.join(root, "driver/nvidia/version")
    if not os.path.exists(path):
        raise DriverError(f"{path}: not found: the NVIDIA driver is not loaded "
                          "(load its kernel module: modprobe nvidia)")
    text = _read(path)
    version = _kernel_module_version(text)
    if not version:
        raise DriverError(f"{path}: no driver version found")
    return version


def _kernel_module_version(text: str) -> str | None:
    at = text.find(_KERNEL_MODULE)
    while at >= 0:
        end = at + len(_KERNEL_MODULE)
        for start in (_after_for_word(text, end), end):  # "(?: for \S+)?" is tried first
            version = _spaced_version(text, start) if start is not None else None
            if version:
                return version
        at = text.find(_KERNEL_MODULE, at + 1)
    return None


def _after_for_word(text: str, pos: int) -> int | None:
    if not text.startswith(" for ", pos):
        return None
    end = pos + 5
    while end < len(text) and not text[end].isspace():
        end += 1
    return end if end > pos + 5 else None


def _spaced_version(text: str, pos: int) -> str | None:
    """Whitespace, then ``digits.digits[.digits]...`` (the longest): the version, or None."""
    start = pos
    while start < len(text) and text[start].isspace():
        start += 1
    if start == pos:
        return None
    cursor, groups, end = start, 0, None
    while True:
        first = cursor
        while cursor < len(text) and text[cursor].isdecimal():
            cursor += 1
        if cursor == first:
            break
        groups += 1
        if groups >= 2:
            end = cursor
        if cursor < len(text) and text[cursor] == ".":
            cursor += 1
        else:
            break
    return text[start:end] if end else None


def _numbered(name: str, prefix: str) -> int | None:
    """``^<prefix>(\\d+)$``: the number, or None (``$`` also matches before a final newline)."""
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix):]
    if digits.endswith("\n"):
        digits = digits[:-1]
    return int(digits) if digits and digits.isdecimal() else None


def gpus(root: str) -> list[GpuInfo]:
    """Every GPU the module knows, in PCI bus order (the order NVML indexes them)."""
    base = os.path.join(root, "driver/nvidia/gpus")
    try:
        buses = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    out = []
    for bus in buses:
        path = os.path.join(base, bus, "information")
        fields = parse_information(_read(path))
        try:
            minor = int(fields["Device Minor"])
        except (KeyError, ValueError):
            raise DriverError(f"{path}: no valid 'Device Minor' line") from None
        out.append(GpuInfo(
            bus_id=fields.get("Bus Location", bus).lower(),
            model=fields.get("Model", ""),
            uuid=fields.get("GPU UUID", ""),
            minor=minor,
            excluded=fields.get("GPU Excluded", "No") == "Yes",
        ))
    return out


def parse_information(text: str) -> dict[str, str]:
    """``Key: \\t value`` lines; keys keep their spaces, values are stripped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def mig_instances(root: str, gpu_minor: int) -> list[MigInstance]:
    """MIG devices of one GPU, in (GI, CI) order, from ``capabilities/gpu<minor>/mig``."""
    base = os.path.join(root, f"driver/nvidia/capabilities/gpu{gpu_minor}/mig")
    try:
        entries = os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for gi_name in entries:
        gi = _numbered(gi_name, "gi")
        if gi is None:
            continue
        try:
            ci_names = os.listdir(os.path.join(base, gi_name))
        except NotADirectoryError:
            continue
        for ci_name in ci_names:
            ci = _numbered(ci_name, "ci")
            if ci is not None:
                out.append(MigInstance(gpu_minor, gi, ci))
    out.sort(key=lambda m: (m.gi, m.ci))
    return out


def mig_minors_table(root: str) -> str:
    """The raw ``driver/nvidia-caps/mig-minors`` text ('' when absent): see :func:`mig_minor`."""
    try:
        return _read(os.path.join(root, "driver/nvidia-caps/mig-minors"))
    except DriverError:
        return ""


def mig_minor(table: str, name: str) -> int | None:
    """The minor of cap ``name`` (``gpu0/gi1/access``) in a :func:`mig_minors_table`.

    Looked up in the text: the table has a line for every possible instance
    (~4300), and a container start needs two of them per MIG device.
    """
    at = -1
    while True:
        at = table.find(name + " ", at + 1)
        if at < 0:
            return None
        if at == 0 or table[at - 1] == "\n":
            end = table.find("\n", at)
            minor = table[at + len(name) + 1:end if end >= 0 else len(table)].strip()
            return int(minor) if minor.isascii() and minor.isdigit() else None


def mig_minors(root: str) -> dict[str, int]:
    """``driver/nvidia-caps/mig-minors``: cap path (``gpu0/gi1/access``) -> minor."""
    path = os.path.join(root, "driver/nvidia-caps/mig-minors")
    try:
        text = _read(path)
    except DriverError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, minor = line.rpartition(" ")
        if name and minor.isdigit():
            out[name] = int(minor)
    return out


def char_majors(root: str) -> dict[str, int]:
    """``devices``: character device name -> major (the dynamic nvidia majors live here)."""
    path = os.path.join(root, "devices")
    out: dict[str, int] = {}
    in_char = False
    for line in _read(path).splitlines():
        if line.startswith("Character devices:"):
            in_char = True
            continue
        if line.startswith("Block devices:"):
            break
        if in_char:
            major, _, name = line.strip().partition(" ")
            if major.isdigit() and name:
                out.setdefault(name.strip(), int(major))
    return out


def params(root: str) -> str:
    """The raw ``driver/nvidia/params`` text ('' when absent)."""
    try:
        return _read(os.path.join(root, "driver/nvidia/params"))
    except DriverError:
        return ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        raise DriverError(f"{path}: not found (is the NVIDIA kernel module loaded?)") from None
    except OSError as e:
        raise DriverError(f"{path}: {e.strerror}") from None
