"""What the host's NVIDIA driver offers, found under three separate roots.

* the driver root: libraries, binaries, sockets, firmware (``/`` or, with the
  GPU Operator's driver container, ``/run/nvidia/driver``);
* the device root: where ``/dev/nvidia*`` live;
* the proc root: the host kernel's ``/proc`` (``/proc/driver/nvidia``, ``/proc/devices``).

Libraries are picked the way libnvidia-container picks them: a name from the
capability's list, found through the driver root's ``ld.so.cache``, whose file
name ends with the kernel module's version. Everything is computed lazily and
cached, so a container that needs only ``utility`` never reads the rest.
"""

from __future__ import annotations

import os

from nvct.base.errors import DriverError, NvctError
from nvct.base.log import logger
from nvct.discover import procfs, utilities
from nvct.discover.catalog import (
    BINARIES,
    COMPAT32,
    COMPAT32_ARCHES,
    CONFIG_DIRS,
    CONFIG_FILES,
    CTL_MINOR,
    EXTRA_LIBRARIES,
    IPC,
    LIBRARIES,
    LIBRARY_SETS,
    MODESET_MINOR,
    MULTIARCH,
    NVIDIA_MAJOR,
    OWN_VERSION_LIBRARIES,
    VDPAU_DIRS,
    XORG_FILES,
    XORG_ROOTS,
    XORG_SUBDIRS,
    library_sets,
    vdpau_dirs,
)
from nvct.discover.devnodes import _DeviceNodes
from nvct.discover.records import Gpu, Library, MigDevice, Node
from nvct.discover.rootpath import join_root as _join, resolve_in_root

#: What callers import from here: the catalog's lists and the records, beside :class:`Driver`.
__all__ = ["Driver", "Library", "MigDevice", "Gpu", "Node", "resolve_in_root", "library_sets", "vdpau_dirs",
           "LIBRARIES", "BINARIES", "IPC", "LIBRARY_SETS", "EXTRA_LIBRARIES", "OWN_VERSION_LIBRARIES",
           "CONFIG_FILES", "XORG_FILES", "MULTIARCH", "COMPAT32", "VDPAU_DIRS", "NVIDIA_MAJOR", "CTL_MINOR",
           "MODESET_MINOR"]

_LIBRARY_CAPABILITY = {name: cap for cap, names in LIBRARIES.items() for name in names}
_ARCH_WITNESSES = ("libcuda.so.1", "libnvidia-ml.so.1")
#: ``uname -m`` -> the ld cache's name for that architecture.
_UNAME_ARCH = {"ppc64le": "ppc64", "arm64": "aarch64"}

_TLS = "libnvidia-tls.so"
_TLS_ABI = (2, 3, 99)

#: Where the kernel's firmware loader looks (after firmware_class.path), in its order; GSP
#: firmware is ``<dir>/nvidia/<driver version>/*.bin`` in the first that has it.
_FIRMWARE_DIRS = ("/lib/firmware/updates/{release}", "/lib/firmware/updates", "/lib/firmware/{release}",
                  "/lib/firmware", "/usr/lib/firmware")
#: The kernel's ``firmware_class.path`` parameter, in the sysfs beside the proc root.
_FIRMWARE_CLASS_PATH = "sys/module/firmware_class/parameters/path"


class _cached:
    """``functools.cached_property`` without importing functools (and collections): every start."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value

class Driver(_DeviceNodes):
    """The driver installation under the three roots; every fact is read on first use."""

    def __init__(self, driver_root: str = "/", dev_root: str = "/", proc_root: str = "/proc",
                 ldcache: str | None = None):
        self.driver_root = driver_root or "/"
        self.dev_root = dev_root or "/"
        self.proc_root = proc_root or "/proc"
        self._ldcache = ldcache or "/etc/ld.so.cache"

    @classmethod
    def from_config(cls, config) -> Driver:
        return cls(config.driver_root, config.dev_root, config.proc_root,
                   config.cli_ldcache or None)

    # --- paths ---
    def host_path(self, path: str) -> str:
        """A driver-root path as seen from the host."""
        return _join(self.driver_root, path)

    # --- the kernel module ---
    @_cached
    def version(self) -> str:
        version = procfs.driver_version(self.proc_root)
        logger.debug("driver version %s (read %s/driver/nvidia/version)", version, self.proc_root)
        return version

    @_cached
    def majors(self) -> dict[str, int]:
        majors = procfs.char_majors(self.proc_root)
        if logger.is_enabled_for("debug"):
            logger.debug("read %s/devices: nvidia majors %s", self.proc_root,
                         {k: v for k, v in majors.items() if k.startswith("nvidia")})
        return majors

    @_cached
    def gpus(self) -> tuple[Gpu, ...]:
        infos = [g for g in procfs.gpus(self.proc_root) if not g.excluded]
        if logger.is_enabled_for("debug"):
            logger.debug("read %s/driver/nvidia/gpus/*/information: %d GPU(s) %s", self.proc_root, len(infos),
                         " ".join(f"{g.bus_id}={g.uuid}" for g in infos))
        table = None
        out = []
        for index, info in enumerate(infos):
            instances = procfs.mig_instances(self.proc_root, info.minor)
            migs = []
            if instances:
                if table is None:
                    table = procfs.mig_minors_table(self.proc_root)
                for i, inst in enumerate(instances):
                    gi_minor = procfs.mig_minor(table, f"gpu{inst.gpu_minor}/gi{inst.gi}/access")
                    if gi_minor is None:
                        gi_minor = 3 + 135 * inst.gpu_minor + 9 * inst.gi
                    ci_minor = procfs.mig_minor(table, f"gpu{inst.gpu_minor}/gi{inst.gi}/ci{inst.ci}/access")
                    migs.append(MigDevice(index, i, inst.gi, inst.ci, gi_minor,
                                          gi_minor + 1 + inst.ci if ci_minor is None else ci_minor))
            out.append(Gpu(index, info.minor, info.uuid, info.bus_id, info.model, tuple(migs)))
            if migs:
                logger.debug("read %s/driver/nvidia/capabilities/gpu%d/mig: %d MIG device(s)",
                             self.proc_root, info.minor, len(migs))
        return tuple(out)

    # --- files under the driver root ---
    @property
    def ldcache_path(self) -> str:
        """The ld.so.cache that libraries are found through, as seen from the host."""
        return self.host_path(self._ldcache)

    def cache_entries(self) -> list:
        """Every entry of that cache (read once)."""
        return self._cache_entries

    @_cached
    def _cache_entries(self):
        from nvct.discover import ldcache

        if not os.path.isdir(self.driver_root):
            raise DriverError(f"nvidia-container-cli.root: the driver root {self.driver_root} does not exist; set it "
                              "to the directory the driver is installed in")
        entries = ldcache.load(self.ldcache_path)
        logger.debug("read %s: %d entries", self.ldcache_path, len(entries))
        return entries

    @_cached
    def arch(self) -> str:
        """The node's architecture, as its ld cache names it (``x86_64``, ``aarch64``).

        Read from the node, never from this process: the ABI of the 64-bit
        libcuda and libnvidia-ml the driver root's cache lists (a driver root
        may be another machine's files, as a simulated node's). A cache with
        none of them, or with several ABIs, falls back to this machine's.
        """
        found = {e.arch for e in self._cache_entries if e.key in _ARCH_WITNESSES} - COMPAT32_ARCHES
        if len(found) == 1:
            arch = found.pop()
            logger.debug("node architecture %s (the ld cache's libcuda.so.1, libnvidia-ml.so.1)", arch)
            return arch
        machine = os.uname().machine
        arch = _UNAME_ARCH.get(machine, machine)
        logger.debug("node architecture %s (this machine's; the ld cache's driver libraries: %s)", arch,
                     ", ".join(sorted(found)) or "none")
        return arch

    @property
    def arches(self) -> tuple[str, ...]:
        """The node's architecture and its compat32 one, if any."""
        compat = COMPAT32.get(self.arch)
        return (self.arch, compat) if compat else (self.arch,)

    @_cached
    def all_libraries(self) -> tuple[Library, ...]:
        """Every driver library the ld cache lists, for every capability and the node's arches."""
        version = self.version
        arches = self.arches
        seen: set[str] = set()
        out = []
        for entry in self._cache_entries:
            base = entry.key.split(".so", 1)[0] + ".so"
            capability = _LIBRARY_CAPABILITY.get(base)
            if capability is None or entry.arch not in arches:
                continue
            real = resolve_in_root(self.driver_root, entry.value)
            if real is None or real in seen or not real.endswith("." + version):
                if real not in seen and logger.is_enabled_for("debug"):
                    logger.debug("skipping %s => %s (%s): %s", entry.key, entry.value, entry.arch,
                                 "missing under the driver root" if real is None
                                 else f"{real} is not of driver {version}")
                continue
            seen.add(real)
            out.append(Library(real, entry.key, capability, entry.arch))
        out.sort(key=lambda lib: (lib.arch != self.arch, lib.path))
        return tuple(out)

    def libraries(self, sets, *, compat32: bool = False) -> list[Library]:
        """The libraries of the library ``sets`` (see :func:`library_sets`), each file once."""
        wanted = set(sets)
        out = [lib for lib in self.all_libraries
               if lib.capability in wanted and (lib.arch == self.arch or compat32)
               and (not lib.soname.startswith(_TLS) or self._tls_abi_ok(lib))]
        paths = {lib.path for lib in out}
        for lib in self.extra_libraries:
            if lib.capability in wanted and lib.path not in paths:
                paths.add(lib.path)
                out.append(lib)
        return out

    @_cached
    def extra_libraries(self) -> tuple[Library, ...]:
        """:data:`EXTRA_LIBRARIES` found through the ld cache (the node's arch only, as the reference's)."""
        by_name = {name: cap for cap, names in EXTRA_LIBRARIES.items() for name in names}
        out: list[Library] = []
        seen: set[str] = set()
        for entry in self._cache_entries:
            base = entry.key.split(".so", 1)[0] + ".so"
            capability = by_name.get(base)
            if capability is None or entry.arch != self.arch:
                continue
            real = resolve_in_root(self.driver_root, entry.value)
            if real is None or real in seen or not (base in OWN_VERSION_LIBRARIES or real.endswith("." + self.version)):
                continue
            seen.add(real)
            out.append(Library(real, entry.key, capability, entry.arch))
        out.sort(key=lambda lib: lib.path)
        return tuple(out)

    def _tls_abi_ok(self, lib: Library) -> bool:
        """libnvidia-tls only with the new TLS ABI (an ELF note "Linux 2.3.99"), as libnvidia-container.

        Read straight from the program headers (nvct.linux.elf), as on every other path.
        """
        from nvct.linux import elf

        try:
            ok = elf.abi_tag(self.host_path(lib.path)) == _TLS_ABI
        except NvctError as e:
            logger.warning("skipping %s: %s", lib.path, e)
            return False
        if not ok:
            logger.debug("skipping %s: no Linux %s ABI note", lib.path, ".".join(map(str, _TLS_ABI)))
        return ok

    def binaries(self, capabilities) -> list[str]:
        """Each driver utility's path, as :mod:`nvct.discover.utilities` finds it under the driver root."""
        dirs = utilities.search_dirs()
        found = (utilities.find(self.driver_root, name, dirs) for cap in capabilities for name in BINARIES.get(cap, ()))
        return [path for path in found if path]

    def ipc(self, capabilities) -> list[str]:
        out = []
        for cap in capabilities:
            for path in IPC.get(cap, ()):
                if os.path.exists(self.host_path(path)):
                    out.append(path)
        return out

    def firmware(self) -> list[str]:
        """GSP firmware, as the kernel's loader finds it: the ``firmware_class.path`` folder first,
        then ``/lib/firmware/updates/<kernel release>`` ... ``/lib/firmware`` (paths under the driver root)."""
        release = os.uname().release
        out: list[str] = []
        for base in [*self._firmware_class_path(), *(p.format(release=release) for p in _FIRMWARE_DIRS)]:
            d = f"{base}/nvidia/{self.version}"
            try:
                names = sorted(os.listdir(self.host_path(d)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            out.extend(f"{d}/{n}" for n in names if n.endswith(".bin"))
            if out:
                break
        return out

    def _firmware_class_path(self) -> list[str]:
        """The kernel's ``firmware_class.path`` (the sysfs beside :attr:`proc_root`), when an absolute folder."""
        sys_path = os.path.join(os.path.dirname(os.path.normpath(self.proc_root)), _FIRMWARE_CLASS_PATH)
        try:
            with open(sys_path, "rb") as f:
                value = f.read(4097).decode("utf-8", "replace").strip()
        except OSError:
            return []
        if not value.startswith("/") or len(value) > 4096 or "\n" in value:
            return []
        return [os.path.normpath(value)]

    def config_files(self, sets) -> list[tuple[str, str]]:
        """(path under the driver root, container path) of the :data:`CONFIG_FILES` of ``sets``."""
        out = []
        for name, target in (entry for s in sorted(sets) for entry in CONFIG_FILES.get(s, ())):
            for d in CONFIG_DIRS:
                path = f"{d}/{name}"
                if os.path.isfile(self.host_path(path)):
                    out.append((path, target or path))
                    break
        return out

    def xorg_files(self) -> list[str]:
        """:data:`XORG_FILES`, each from the first directory that has it (paths under the driver root)."""
        cuda = [lib for lib in self.all_libraries if lib.soname == "libcuda.so.1" and lib.arch == self.arch]
        libdir = os.path.dirname(cuda[0].path) if cuda else None
        dirs = [f"{libdir}/nvidia/xorg"] + [f"{libdir}/xorg/{sub}" for sub in XORG_SUBDIRS] if libdir else []
        dirs += [f"{root}/{sub}" for root in XORG_ROOTS for sub in XORG_SUBDIRS]
        out = []
        for pattern in XORG_FILES:
            name = pattern.format(version=self.version)
            for d in dirs:
                if os.path.isfile(self.host_path(f"{d}/{name}")):
                    out.append(f"{d}/{name}")
                    break
        return out

    def vdpau_libraries(self) -> list[Library]:
        """libvdpau_nvidia is not in the ld cache; it lives in a ``vdpau/`` subdir.

        libvdpau opens it as ``vdpau/libvdpau_nvidia.so.1``, the SONAME every driver gives it.
        """
        out = []
        for d in vdpau_dirs(self.arch):
            path = f"{d}/libvdpau_nvidia.so.{self.version}"
            if os.path.isfile(self.host_path(path)):
                out.append(Library(path, "libvdpau_nvidia.so.1", "video", self.arch))
        return out

    # --- NVML, only for what procfs cannot tell ---
    def nvml(self):
        from nvct.discover import nvml

        path = nvml.find_library(self.driver_root, self._cache_entries, self.arch)
        if path is None:
            raise DriverError(f"{self.driver_root}: libnvidia-ml.so.1 not found")
        logger.debug("loading NVML from %s", path)
        return nvml.Nvml(path)

    @_cached
    def mig_uuids(self) -> dict[str, tuple[int, int]]:
        """MIG UUID -> (gpu index, mig index); empty when no GPU has MIG devices."""
        if not any(g.migs for g in self.gpus):
            return {}
        out = {}
        with self.nvml() as nvml:
            for gpu in self.gpus:
                if not gpu.migs:
                    continue
                by_ids = {(m.gi, m.ci): m.index for m in gpu.migs}
                for info in nvml.mig_devices(nvml.handle_by_uuid(gpu.uuid)):
                    if (info.gi, info.ci) in by_ids:
                        out[info.uuid] = (gpu.index, by_ids[(info.gi, info.ci)])
        return out

    @_cached
    def mig_gfx(self) -> frozenset[tuple[int, int]]:
        """(gpu index, GI id) of each GPU instance with a graphics (``+gfx``) profile: NVML.

        Asked only for a MIG device whose parent has DRM nodes. Where NVML cannot
        tell, a warning and none: the MIG device still works, without its DRM nodes.
        """
        out: set[tuple[int, int]] = set()
        try:
            with self.nvml() as nvml:
                for gpu in self.gpus:
                    if gpu.migs:
                        out.update((gpu.index, gi) for gi in nvml.gfx_gpu_instances(nvml.handle_by_uuid(gpu.uuid)))
        except DriverError as e:
            logger.warning("graphics MIG profiles unknown, so no MIG device gets DRM nodes: %s", e)
            return frozenset()
        return frozenset(out)
