"""The CUDA forward-compat step: whether the image's compat libcuda is used, and enabling it."""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.hooks.container import HookContext

_COMPAT_DIR = "/usr/local/cuda/compat"
_COMPAT_CONF = "/etc/ld.so.conf.d/00-compat-nvct.conf"


def enable_cuda_compat(step: kinds.EnableCudaCompat, ctx: HookContext) -> None:
    """Prefer the image's CUDA forward-compat libcuda where :func:`compat_choice` says it works here."""
    root = ctx.root
    folder, _ = compat_choice(root, step, ctx.spec)
    if folder is None:
        return
    ctx.extra_folders.insert(0, folder)
    root.write_file(_COMPAT_CONF, (folder + "\n").encode(), 0o644, replace=True)


def compat_choice(root, step: kinds.EnableCudaCompat, spec: dict | None = None) -> tuple[str | None, str]:
    """Whether the image's CUDA compat libcuda is to be used: (its folder's real path or None, why).

    The one rule (the shim, the hook and ``nvct explain`` ask it). The folder is
    ``--cuda-compat-container-root`` (default /usr/local/cuda/compat); its newest
    ``libcuda.so.X.Y[.Z]`` decides, by its ``.note.cuda.fwd_compatibility``
    (nvct.linux.elf.cuda_compat_note), as the reference does: with ``--host-driver-version``,
    the host's branch must be listed and the compat libcuda newer than the host's; else,
    with ``--host-cuda-version``, the note's CUDA version must be newer. nvct adds the
    note's device list (:func:`_unlisted`): every GPU of the container must be of a brand
    it lists. Without a note, a newer driver major decides (older compat packages carry none).
    """
    import stat

    host = step.host_driver_version
    host_cuda = step.host_cuda_version
    folder = _absolute(step.compat_root or _COMPAT_DIR)
    if not (host or host_cuda):
        return None, "no --host-driver-version or --host-cuda-version: the host driver is unknown"
    if not root.exists(folder):
        return None, f"the image has no {folder}"
    best = None
    for name in root.listdir(folder):
        version = _compat_version(name)
        if version is not None and (best is None or version > best[0]):
            best = (version, name)
    if best is None:
        return None, f"the image has no libcuda.so.<version> in {folder}"
    version, name = best
    path = folder.rstrip("/") + "/" + name
    try:
        fd = root.open(path)
    except NvctError as e:
        return None, f"{path} cannot be read: {e}"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, f"{path} cannot be read: not a regular file"
    note = _compat_note(fd, path)
    host_version = _version(host)
    shown = ".".join(map(str, version))
    if note is None:
        if host_version is None:
            return None, f"{path} carries no CUDA compat note and the host driver version is unknown"
        if version[0] <= host_version[0]:
            return None, f"{path} ({shown}, no CUDA compat note) is not of a newer branch than the host's {host}"
        return root.realpath(folder), (f"{path} ({shown}, no CUDA compat note) is of a newer branch "
                                       f"than the host's {host}")
    branches = _field(note, "Driver")
    branches = [b for b in branches if type(b) is int] if isinstance(branches, list) else []
    cuda = _field(note, "CUDA Version")
    if host_version is not None and branches:
        if host_version[0] not in branches:
            return None, (f"{path}: its CUDA compat note lists the driver branches "
                          f"{', '.join(map(str, branches))}, not the host's {host_version[0]} (CUDA error 804 if used)")
        if version <= host_version:
            return None, f"{path} ({shown}) is not newer than the host driver {host}"
        why = f"{path} ({shown}) supports the host's branch {host_version[0]} and is newer than {host}"
    elif host_cuda and isinstance(cuda, str) and (theirs := _version(cuda)) is not None and \
            (ours := _version(host_cuda)) is not None:
        if theirs <= ours:
            return None, f"{path}: its CUDA {cuda} is not newer than the host's CUDA {host_cuda}"
        why = f"{path}: its CUDA {cuda} is newer than the host's CUDA {host_cuda}"
    else:
        return None, f"{path}: its CUDA compat note and the host versions given have nothing to compare"
    devices = _field(note, "Device")
    devices = [d for d in devices if type(d) is int] if isinstance(devices, list) else []
    if devices:  # only now, and only for a note with a device list, is NVML asked
        unlisted, unknown = _unlisted(devices, step, spec)
        if unlisted:
            listed = ", ".join(map(str, devices[:32])) + (", ..." if len(devices) > 32 else "")  # the image's
            return None, (f"{path}: its CUDA compat note's device list ({listed}) does not "
                          f"list {'; '.join(unlisted)} (CUDA error 804 if used)")
        why += f"; {unknown}" if unknown else "; the note's device list names the brand of every GPU"
    return root.realpath(folder), why


def _field(note: dict, name: str):
    """A field of the note by its name in any case, as the reference's JSON decoding matches it:
    the packages write ``driver``, ``device`` and ``CUDA version`` (CUDA 13.0's 580.95.05)."""
    if name in note:
        return note[name]
    folded = name.casefold()
    return next((v for k, v in note.items() if isinstance(k, str) and k.casefold() == folded), None)


def _unlisted(devices: list[int], step: kinds.EnableCudaCompat, spec: dict | None) -> tuple[list[str], str]:
    """The container's GPUs whose NVML brand the note's device list leaves out, and why none could be checked.

    CUDA fails with error 804 when any GPU it sees is unsupported, so every GPU
    counts: ``--gpu-brand`` ids as given, else the brands of the ``--gpu-uuid`` GPUs
    (jit-cdi, legacy), else those of the spec's ``/dev/nvidiaN`` nodes (a CDI spec's
    chain, which names no GPU), both from NVML under ``--driver-root``. Where the GPUs or
    their brands cannot be known, the list is not checked (as the reference, which never does).
    """
    if step.gpu_brands:
        return [f"the GPU brand {b}" for b in dict.fromkeys(step.gpu_brands)
                if not (b.isascii() and b.isdigit() and int(b) in devices)], ""
    minors = () if step.gpu_uuids else _spec_gpu_minors(spec)
    if not step.gpu_uuids and not minors:
        return [], "the container's GPUs are unknown: the note's device list is not checked"
    try:
        found = _nvml_brands(step.driver_root or "/", tuple(step.gpu_uuids), minors)
    except NvctError as e:
        sys.stderr.write(f"enable-cuda-compat: {e}; the note's device list is not checked\n")
        return [], f"the note's device list is not checked ({e})"
    from nvct.discover.nvml import BRAND_NAMES

    return [f"GPU {gpu} ({BRAND_NAMES.get(brand, 'unknown')}, brand {brand})"
            for gpu, brand in found if brand not in devices], ""


#: NVML's answers in this process: the shim and the hook step it runs early ask the same question.
_BRANDS: dict[tuple, list[tuple[str, int]]] = {}


def _nvml_brands(driver_root: str, uuids: tuple[str, ...], minors: tuple[int, ...]) -> list[tuple[str, int]]:
    """(GPU, NVML brand id) of the GPUs by UUID, else by device minor; NVML loaded from the driver root."""
    key = (driver_root, uuids, minors)
    if key in _BRANDS:
        return _BRANDS[key]
    from nvct.base.errors import DriverError
    from nvct.discover import nvml

    library = nvml.find_library(driver_root, None, os.uname().machine)
    if library is None:
        raise DriverError(f"no libnvidia-ml.so.1 under the driver root {driver_root}")
    with nvml.Nvml(library) as lib:
        if uuids:
            found = [(uuid, lib.brand_id(lib.handle_by_uuid(uuid))) for uuid in uuids]
        else:
            handles = [lib.handle_by_index(i) for i in range(lib.device_count())]
            by_minor = {lib.minor(h): h for h in handles}
            found = [(f"/dev/nvidia{m}", lib.brand_id(by_minor[m])) for m in minors if m in by_minor]
    _BRANDS[key] = found
    return found


def _spec_gpu_minors(spec: dict | None) -> tuple[int, ...]:
    """The N of each ``/dev/nvidiaN`` the container's spec has, as a device or a bind mount (rootless podman)."""
    linux = spec.get("linux") if isinstance(spec, dict) else None
    nodes = linux.get("devices") if isinstance(linux, dict) else None
    mounts = spec.get("mounts") if isinstance(spec, dict) else None
    paths = [d.get("path") for d in nodes if isinstance(d, dict)] if isinstance(nodes, list) else []
    paths += [m.get("destination") for m in mounts if isinstance(m, dict)] if isinstance(mounts, list) else []
    minors = []
    for path in paths:
        if isinstance(path, str) and path.startswith("/dev/nvidia"):
            n = path[len("/dev/nvidia"):]
            if n.isascii() and n.isdigit() and len(n) < 8 and int(n) not in minors:
                minors.append(int(n))
    return tuple(minors)


def _compat_note(fd: int, path: str) -> dict | None:
    """The note of the compat libcuda open at ``fd`` (closed here); None without one or when it is corrupt."""
    from nvct.linux import elf

    try:
        return elf.cuda_compat_note(fd, path)
    except NvctError as e:
        sys.stderr.write(f"enable-cuda-compat: {e}; deciding by the driver version alone\n")
        return None
    finally:
        os.close(fd)


def _absolute(path: str) -> str:
    import posixpath

    return posixpath.normpath("/" + path.lstrip("/"))


def _compat_version(name: str) -> tuple[int, ...] | None:
    """``libcuda.so.<major>.<minor>[.<patch>]`` -> the version (no ``re``: this runs on every start)."""
    if not name.startswith("libcuda.so."):
        return None
    parts = name[len("libcuda.so."):].split(".")
    if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _version(version: str) -> tuple[int, ...] | None:
    """"575.57.08" -> (575, 57, 8) (numbers, so leading zeros do not count); None if not numeric."""
    parts = version.strip().split(".")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)
