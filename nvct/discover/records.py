"""The values driver discovery returns: libraries, GPUs and their MIG devices, device nodes."""

from __future__ import annotations

from nvct.base.record import Record
from nvct.discover.catalog import COMPAT32_ARCHES


class Library(Record):
    """A driver library: ``path`` is where it lies under the driver root (and in the container)."""
    __slots__ = ("path", "soname", "capability", "arch")


    path: str
    soname: str
    capability: str
    arch: str

    @property
    def compat32(self) -> bool:
        """A 32-bit library of a 64-bit node (i386 on x86-64)."""
        return self.arch in COMPAT32_ARCHES


class MigDevice(Record):

    __slots__ = ("gpu_index", "index", "gi", "ci", "gi_cap_minor", "ci_cap_minor")
    gpu_index: int
    index: int
    gi: int
    ci: int
    gi_cap_minor: int
    ci_cap_minor: int

    @property
    def name(self) -> str:
        return f"{self.gpu_index}:{self.index}"


class Gpu(Record):

    __slots__ = ("index", "minor", "uuid", "bus_id", "model", "migs")
    _defaults = {"migs": ()}
    _uncompared = frozenset({'migs'})
    index: int
    minor: int
    uuid: str
    bus_id: str
    model: str
    migs: tuple[MigDevice, ...]

    @property
    def mig_enabled(self) -> bool:
        return bool(self.migs)

    @property
    def device_path(self) -> str:
        return f"/dev/nvidia{self.minor}"


class Node(Record):
    """A character device node of the driver, as a container should see it."""
    __slots__ = ("path", "major", "minor", "host_path", "file_mode")
    _defaults = {"file_mode": None}
    path: str
    major: int
    minor: int
    host_path: str
    file_mode: int | None
