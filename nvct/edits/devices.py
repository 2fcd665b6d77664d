"""Turn requested device ids into the host's GPUs and MIG devices.

Ids take every form the reference accepts: an index (``1``), a MIG device
as ``GPU:MIG`` (``0:1``), a GPU or MIG UUID, a PCI bus id, ``all``, and the
``nvidia.com/gpu=<id>`` CDI name of any of those.
"""

from __future__ import annotations

from nvct.base.errors import RequestError
from nvct.base.log import logger
from nvct.base.record import Record
from nvct.discover.driver import Driver, Gpu, MigDevice

_BUS_PATTERN = r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"


class Selection(Record):
    """Whole GPUs and MIG devices chosen for one container, in request order."""
    __slots__ = ("gpus", "migs")
    _defaults = {"gpus": (), "migs": ()}
    gpus: tuple[Gpu, ...]
    migs: tuple[tuple[Gpu, MigDevice], ...]

    def all_parents(self) -> list[Gpu]:
        """Every GPU whose device node the container needs (whole GPUs and MIG parents)."""
        out = list(self.gpus)
        for gpu, _ in self.migs:
            if gpu not in out:
                out.append(gpu)
        return out


def select(ids: tuple[str, ...], driver: Driver, *, default_kind: str = "nvidia.com/gpu",
           what: str = "NVIDIA_VISIBLE_DEVICES") -> Selection:
    """Resolve ``ids`` against ``driver``; an id that matches nothing is an error."""
    gpus: list[Gpu] = []
    migs: list[tuple[Gpu, MigDevice]] = []
    for raw in ids:
        ident = _strip_kind(raw, default_kind)
        if ident == "all":
            for gpu in driver.gpus:
                _add(gpus, gpu)
                for mig in gpu.migs:
                    _add(migs, (gpu, mig))
            continue
        found = _find(ident, driver)
        if found is None and not driver.gpus:
            _ = driver.version  # no module loaded: say so (DriverError), as "all" does
        if found is None:
            raise RequestError(f"{what}: unknown device {raw!r} ({_describe(driver)})")
        logger.debug("%s: %r is %s", what, raw, _name(found))
        if isinstance(found, Gpu):
            _add(gpus, found)
        else:
            _add(migs, found)
    return Selection(tuple(gpus), tuple(migs))


def _strip_kind(ident: str, default_kind: str) -> str:
    kind, sep, name = ident.partition("=")
    if sep and kind == default_kind:
        return name
    return ident


def _find(ident: str, driver: Driver):
    gpus = driver.gpus
    if _number(ident):
        index = int(ident)
        return gpus[index] if index < len(gpus) else None
    gpu_part, sep, mig_part = ident.partition(":")
    if sep and _number(gpu_part) and _number(mig_part):
        g, m = int(gpu_part), int(mig_part)
        if g < len(gpus) and m < len(gpus[g].migs):
            return gpus[g], gpus[g].migs[m]
        return None
    lowered = ident.lower()
    if lowered.startswith("gpu-"):
        for gpu in gpus:
            if gpu.uuid.lower() == lowered:
                return gpu
        return None
    if lowered.startswith("mig-"):
        return _find_mig_uuid(ident, driver)
    bus = _normalize_bus_id(ident)
    if bus:
        for gpu in gpus:
            if gpu.bus_id == bus:
                return gpu
    return None


def _number(text: str) -> bool:
    # str.isdigit() also takes "²" (int() fails) and "٣" (int() gives 3).
    return text.isascii() and text.isdigit()


def _find_mig_uuid(ident: str, driver: Driver):
    for uuid, (g, m) in driver.mig_uuids.items():
        if uuid.lower() == ident.lower():
            gpu = driver.gpus[g]
            return gpu, gpu.migs[m]
    return None


def _normalize_bus_id(ident: str) -> str | None:
    """``00000000:1B:00.0``, ``0000:1b:00.0`` or ``1b:00.0`` -> ``0000:1b:00.0`` (procfs's form)."""
    import re  # only for PCI bus ids: re and enum cost ~5 ms on every container start

    m = re.match(_BUS_PATTERN, ident)
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _name(found) -> str:
    if isinstance(found, Gpu):
        return f"GPU {found.index} ({found.uuid}, /dev/nvidia{found.minor})"
    gpu, mig = found
    return f"MIG device {mig.name} of GPU {gpu.index} (GI {mig.gi}, CI {mig.ci})"


def _add(items: list, item) -> None:
    if item not in items:
        items.append(item)


def _describe(driver: Driver) -> str:
    n = len(driver.gpus)
    if n == 0:
        return "this node has no GPUs"
    migs = sum(len(g.migs) for g in driver.gpus)
    text = f"this node has GPUs 0-{n - 1}" if n > 1 else "this node has GPU 0"
    if migs:
        text += f" and {migs} MIG device(s)"
    return text + "; 'nvct info' lists their indices and UUIDs"
