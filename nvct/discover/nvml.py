"""A small ctypes binding of the few NVML calls nvct needs.

nvidia-ml-py is not packaged in Debian, and nvct only needs what procfs
cannot tell: MIG UUIDs, the CUDA driver version, architecture and brand.
The library is loaded lazily, from the driver root, and only when one of
those facts is asked for.
"""

from __future__ import annotations

import ctypes
import os

from nvct.base.errors import DriverError
from nvct.base.record import Record

SUCCESS = 0
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_ARGUMENT_VERSION_MISMATCH = 25
_ADDRESSING_ATS = 2  # NVML_DEVICE_ADDRESSING_MODE_ATS

#: NVML brand ids (nvmlBrandType_t) -> the names libnvidia-container reports (the simulated node's too).
BRAND_NAMES = {
    0: "unknown", 1: "quadro", 2: "tesla", 3: "nvs", 4: "grid", 5: "geforce", 6: "titan",
    7: "nvidiavapps", 8: "nvidiavpc", 9: "nvidiavcs", 10: "nvidiavws", 11: "nvidiacloudgaming",
    12: "quadrortx", 13: "nvidiartx", 14: "nvidia", 15: "geforcertx", 16: "titanrtx",
}
_ARCHS = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
          8: "ada", 9: "hopper", 10: "blackwell"}
#: ``NVML_GPU_INSTANCE_PROFILE_CAPS_GFX``: a GPU instance profile with graphics (``1g.24gb+gfx``).
GI_PROFILE_CAPS_GFX = 2
#: ``NVML_GPU_INSTANCE_PROFILE_{1,2,4,3}_SLICE_GFX``: graphics profiles by their constant (v2 drivers).
_GFX_PROFILES = frozenset({10, 11, 12, 17})
_GI_PROFILE_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_COUNT
_MAX_GPU_INSTANCES = 16


class _GiProfileInfo(ctypes.Structure):
    """``nvmlGpuInstanceProfileInfo_v3_t``; v2 has the same size (``isP2pSupported`` where v3 has none,
    no ``capabilities``): only ``version``, ``id`` and, for v3, ``capabilities`` are read."""

    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("_counts", ctypes.c_uint * 8),
                ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96),
                ("capabilities", ctypes.c_uint)]


class _GpuInstanceInfo(ctypes.Structure):  # nvmlGpuInstanceInfo_t
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class MigInfo(Record):
    """One MIG device as NVML lists it."""

    __slots__ = ("index", "uuid", "gi", "ci")
    index: int
    uuid: str
    gi: int
    ci: int


class Nvml:
    """An initialized NVML; use as a context manager so nvmlShutdown always runs."""

    def __init__(self, library_path: str):
        try:
            self._lib = ctypes.CDLL(library_path)
        except OSError as e:
            raise DriverError(f"{library_path}: cannot load NVML: {_foreign(library_path) or e}") from None
        self._path = library_path
        self._call("nvmlInit_v2")

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._lib is not None:
            self._lib.nvmlShutdown()
            self._lib = None  # type: ignore[assignment]  # closed: every call fails loudly

    def cuda_driver_version(self) -> str:
        """CUDA version the driver supports, as "12.4"."""
        v = ctypes.c_int()
        self._call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(v), fallback="nvmlSystemGetCudaDriverVersion")
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"

    def driver_version(self) -> str:
        buf = ctypes.create_string_buffer(96)
        self._call("nvmlSystemGetDriverVersion", buf, ctypes.c_uint(96))
        return buf.value.decode()

    def device_count(self) -> int:
        n = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(n))
        return n.value

    def handle_by_uuid(self, uuid: str) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(h))
        return h

    def handle_by_index(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(h))
        return h

    def uuid(self, handle) -> str:
        buf = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetUUID", handle, buf, ctypes.c_uint(96))
        return buf.value.decode()

    def minor(self, handle) -> int:
        v = ctypes.c_uint()
        self._call("nvmlDeviceGetMinorNumber", handle, ctypes.byref(v))
        return v.value

    def compute_capability(self, handle) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
        return f"{major.value}.{minor.value}"

    def brand(self, handle) -> str:
        return BRAND_NAMES.get(self.brand_id(handle), "unknown")

    def brand_id(self, handle) -> int:
        """nvmlBrandType_t, the ids a CUDA compat note's device list names."""
        v = ctypes.c_int()
        self._call("nvmlDeviceGetBrand", handle, ctypes.byref(v))
        return v.value

    def persistence_mode(self, handle) -> bool:
        v = ctypes.c_int()
        self._call("nvmlDeviceGetPersistenceMode", handle, ctypes.byref(v))
        return v.value == 1

    def architecture(self, handle) -> str:
        v = ctypes.c_uint()
        self._call("nvmlDeviceGetArchitecture", handle, ctypes.byref(v))
        return _ARCHS.get(v.value, "unknown")

    def coherent(self, handle) -> bool:
        """ATS addressing (``nvmlDeviceGetAddressingMode``): GPU memory coherent with the CPU's.

        False where the driver lacks the call or the GPU does not support it, as go-nvlib decides.
        """
        fn = getattr(self._lib, "nvmlDeviceGetAddressingMode", None)
        if fn is None:
            return False

        class _Mode(ctypes.Structure):  # nvmlDeviceAddressingMode_v1_t
            _fields_ = [("version", ctypes.c_uint), ("value", ctypes.c_uint)]

        mode = _Mode(ctypes.sizeof(_Mode) | (1 << 24), 0)
        rc = fn(handle, ctypes.byref(mode))
        if rc == ERROR_NOT_SUPPORTED:
            return False
        self._check("nvmlDeviceGetAddressingMode", rc)
        return mode.value == _ADDRESSING_ATS

    def set_memory_limits(self, handle, cgroup: str, soft: int, hard: int) -> None:
        """Soft and hard GPU memory limits (bytes) for the processes of the cgroup v2 directory ``cgroup``.

        ``nvmlDeviceSetMemoryLimits_v1``: drivers without it get one line saying so.
        """
        class _Limits(ctypes.Structure):  # nvmlDeviceSetMemoryLimits_v1_t
            _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                        ("hardLimit", ctypes.c_ulonglong)]

        name = "nvmlDeviceSetMemoryLimits_v1"
        if getattr(self._lib, name, None) is None:
            raise DriverError(f"{self._path}: this driver's NVML has no {name}: "
                              "it cannot limit a container's GPU memory (a newer driver can)")
        self._call(name, handle, ctypes.byref(_Limits(cgroup.encode(), soft, hard)))

    def mig_devices(self, handle) -> list[MigInfo]:
        """The MIG devices of a GPU (empty when MIG is off or unsupported)."""
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        rc = self._lib.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending))
        if rc != SUCCESS or current.value != 1:
            return []
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetMaxMigDeviceCount", handle, ctypes.byref(count))
        out: list[MigInfo] = []
        for i in range(count.value):
            mig = ctypes.c_void_p()
            rc = self._lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, ctypes.c_uint(i), ctypes.byref(mig))
            if rc == ERROR_NOT_FOUND:
                continue
            self._check("nvmlDeviceGetMigDeviceHandleByIndex", rc)
            gi, ci = ctypes.c_uint(), ctypes.c_uint()
            self._call("nvmlDeviceGetGpuInstanceId", mig, ctypes.byref(gi))
            self._call("nvmlDeviceGetComputeInstanceId", mig, ctypes.byref(ci))
            out.append(MigInfo(len(out), self.uuid(mig), gi.value, ci.value))
        return out

    def gfx_gpu_instances(self, handle) -> frozenset[int]:
        """The ids of a MIG-enabled GPU's GPU instances whose profile has graphics (``+gfx``).

        A profile is one by ``NVML_GPU_INSTANCE_PROFILE_CAPS_GFX`` in its info's ``capabilities``
        (v3), or, where the driver has only v2, by its constant (the ``*_SLICE_GFX`` ones).
        """
        fn = getattr(self._lib, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
        if fn is None:
            return frozenset()  # older than any graphics profile
        info, gfx_ids = _GiProfileInfo(), []
        for profile in range(_GI_PROFILE_COUNT):
            for version in (3, 2):
                ctypes.memset(ctypes.byref(info), 0, ctypes.sizeof(info))
                info.version = ctypes.sizeof(info) | (version << 24)
                rc = fn(handle, ctypes.c_uint(profile), ctypes.byref(info))
                if rc != ERROR_ARGUMENT_VERSION_MISMATCH:
                    break
            if rc in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                continue  # no such profile on this GPU
            self._check("nvmlDeviceGetGpuInstanceProfileInfoV", rc)
            caps = info.capabilities if version == 3 else 0
            if caps & GI_PROFILE_CAPS_GFX or profile in _GFX_PROFILES:
                gfx_ids.append(info.id)
        out: set[int] = set()
        for profile_id in gfx_ids:
            instances, count = (ctypes.c_void_p * _MAX_GPU_INSTANCES)(), ctypes.c_uint(_MAX_GPU_INSTANCES)
            self._call("nvmlDeviceGetGpuInstances", handle, ctypes.c_uint(profile_id), instances,
                       ctypes.byref(count))
            for i in range(count.value):
                gi = _GpuInstanceInfo()
                self._call("nvmlGpuInstanceGetInfo", ctypes.c_void_p(instances[i]), ctypes.byref(gi))
                out.add(gi.id)
        return frozenset(out)

    def _call(self, name: str, *args, fallback: str | None = None) -> None:
        fn = getattr(self._lib, name, None)
        if fn is None and fallback:
            name, fn = fallback, getattr(self._lib, fallback, None)
        if fn is None:
            raise DriverError(f"{self._path}: NVML has no {name} (driver too old?)")
        self._check(name, fn(*args))

    def _check(self, name: str, rc: int) -> None:
        if rc != SUCCESS:
            err = self._lib.nvmlErrorString
            err.restype = ctypes.c_char_p
            raise DriverError(f"NVML {name} failed: {err(rc).decode(errors='replace')} (code {rc})")


def _foreign(path: str) -> str | None:
    """Why a library of another machine's architecture cannot load here (a driver root of such a node)."""
    from nvct.linux import elf

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            head = elf.header(fd)
        finally:
            os.close(fd)
    except OSError:
        return None
    if head is None:
        return None
    machine = head.machine
    ours = {"x86_64": 62, "aarch64": 183, "ppc64le": 21}.get(os.uname().machine)
    if ours is None or machine == ours:
        return None
    names = {62: "x86-64", 183: "aarch64", 21: "ppc64", 3: "i386"}
    return (f"an {names.get(machine, f'e_machine {machine}')} library, and this machine is {os.uname().machine}: "
            "NVML answers only where the driver's architecture is the machine's")


def find_library(driver_root: str, ldcache_entries, arch: str) -> str | None:
    """The node's (``arch``) libnvidia-ml.so.1 under the driver root: through the ld cache, else the usual dirs."""
    from nvct.discover.driver import MULTIARCH

    for entry in ldcache_entries or ():
        if entry.key == "libnvidia-ml.so.1" and entry.arch == arch:
            path = os.path.join(driver_root, entry.value.lstrip("/"))
            if os.path.exists(path):
                return path
    for d in (f"usr/lib/{MULTIARCH.get(arch, arch + '-linux-gnu')}", "usr/lib64", "usr/lib", "lib64"):
        path = os.path.join(driver_root, d, "libnvidia-ml.so.1")
        if os.path.exists(path):
            return path
    return None
