"""The mock NVML, libcuda and nvidia-smi, exercised the way real tools use them."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess

import pytest

from .conftest import needs_root

pytestmark = needs_root

LIB64 = "usr/lib/x86_64-linux-gnu"
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 1, 2, 3, 6, 7
DRIVER_NOT_LOADED, ARGUMENT_VERSION_MISMATCH = 9, 25
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.\n")


class PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Attributes(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint) for n in (
        "multiprocessorCount", "sharedCopyEngineCount", "sharedDecoderCount", "sharedEncoderCount",
        "sharedJpegCount", "sharedOfaCount", "gpuInstanceSliceCount", "computeInstanceSliceCount")] + [
        ("memorySizeMB", ctypes.c_ulonglong)]


class GpuInstanceInfo(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class ComputeInstanceInfo(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("gpuInstance", ctypes.c_void_p), ("id", ctypes.c_uint),
                ("profileId", ctypes.c_uint), ("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class Nvml:
    """A loaded copy of the mock (each root's copy has its own state)."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def handle(self, index):
        h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) == SUCCESS
        return h

    def string(self, fn, handle, size=96):
        buf = ctypes.create_string_buffer(size)
        assert getattr(self.lib, fn)(handle, buf, size) == SUCCESS
        return buf.value.decode()

    def uint(self, fn, handle):
        v = ctypes.c_uint()
        rc = getattr(self.lib, fn)(handle, ctypes.byref(v))
        return rc, v.value

    def count(self):
        n = ctypes.c_uint()
        assert self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == SUCCESS
        return n.value

    def mig(self, handle, index):
        m = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, index, ctypes.byref(m))
        return rc, m


@pytest.fixture
def nvml(node550):
    n = Nvml(os.path.join(node550["roots"]["driver_root"], LIB64, "libnvidia-ml.so.1"))
    assert n.nvmlInit_v2() == SUCCESS
    yield n
    assert n.nvmlShutdown() == SUCCESS


def make_root(tmp_path, node, name, nodes):
    """A second root holding a copy of the mock and only some device nodes (like a container)."""
    root = tmp_path / name
    lib = root / LIB64
    lib.mkdir(parents=True)
    src = os.path.join(node["roots"]["driver_root"], LIB64)
    shutil.copy(os.path.join(src, "libnvidia-ml.so.550.54.15"), lib / "libnvidia-ml.so.550.54.15")
    os.symlink("libnvidia-ml.so.550.54.15", lib / "libnvidia-ml.so.1")
    (root / "usr/bin").mkdir()
    shutil.copy(os.path.join(node["roots"]["driver_root"], "usr/bin/nvidia-smi"), root / "usr/bin/nvidia-smi")
    for path, (major, minor) in nodes.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(root / path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return root


def smi(root, *args, env=None):
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": os.path.join(root, LIB64), **(env or {})}
    return subprocess.run([os.path.join(root, "usr/bin/nvidia-smi"), *args], capture_output=True, text=True, env=env)


# --- NVML ---

def test_versions_work_without_init(node550):
    n = Nvml(os.path.join(node550["roots"]["driver_root"], LIB64, "libnvidia-ml.so.550.54.15"))
    buf = ctypes.create_string_buffer(80)
    assert n.nvmlSystemGetDriverVersion(buf, 80) == SUCCESS and buf.value == b"550.54.15"
    assert n.nvmlSystemGetNVMLVersion(buf, 80) == SUCCESS and buf.value == b"12.550.54.15"
    assert n.nvmlSystemGetDriverVersion(buf, 5) == INSUFFICIENT_SIZE
    cuda = ctypes.c_int()
    assert n.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)) == SUCCESS and cuda.value == 12040
    count = ctypes.c_uint()
    assert n.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED
    assert n.nvmlErrorString(DRIVER_NOT_LOADED) == b"Driver Not Loaded"


def test_enumerates_the_topology(nvml, node550):
    assert nvml.count() == 8
    for g in node550["gpus"]:
        h = nvml.handle(g["index"])
        assert nvml.string("nvmlDeviceGetName", h) == g["model"]
        assert nvml.string("nvmlDeviceGetUUID", h) == g["uuid"]
        assert nvml.uint("nvmlDeviceGetMinorNumber", h) == (SUCCESS, g["minor"])
        assert nvml.uint("nvmlDeviceGetIndex", h) == (SUCCESS, g["index"])
        pci = PciInfo()
        assert nvml.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)) == SUCCESS
        domain, bus, rest = g["bus_id"].split(":")
        assert pci.busId.decode() == f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"
        assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x233010DE, 0x16C110DE)


def test_device_properties(nvml):
    h = nvml.handle(0)
    assert nvml.uint("nvmlDeviceGetBrand", h) == (SUCCESS, 14)
    assert nvml.uint("nvmlDeviceGetArchitecture", h) == (SUCCESS, 9)
    major, minor = ctypes.c_int(), ctypes.c_int()
    assert nvml.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor)) == SUCCESS
    assert (major.value, minor.value) == (9, 0)
    mem = Memory()
    assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) == SUCCESS
    assert mem.total == 81559 * 2**20 and mem.free + mem.used == mem.total
    v2 = MemoryV2(version=ctypes.sizeof(MemoryV2) | 2 << 24)
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(v2)) == SUCCESS and v2.reserved == 593 * 2**20
    v2.version = 1
    assert nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(v2)) == ARGUMENT_VERSION_MISMATCH
    assert nvml.string("nvmlDeviceGetVbiosVersion", h) == "96.00.99.00.01"
    assert nvml.string("nvmlDeviceGetBoardPartNumber", h) == "692-2G520-0200-000"
    assert nvml.uint("nvmlDeviceGetNumGpuCores", h) == (SUCCESS, 16896)
    assert nvml.uint("nvmlDeviceGetFanSpeed", h)[0] == NOT_SUPPORTED
    assert nvml.uint("nvmlDeviceGetEnforcedPowerLimit", h) == (SUCCESS, 700000)


def test_lookup_by_uuid_and_bus_id(nvml, node550):
    g3 = node550["gpus"][3]
    h = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByUUID(g3["uuid"].encode(), ctypes.byref(h)) == SUCCESS
    assert h.value == nvml.handle(3).value
    for bus in (b"00000000:61:00.0", b"0000:61:00.0"):
        assert nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(h)) == SUCCESS
        assert h.value == nvml.handle(3).value
    assert nvml.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000", ctypes.byref(h)) == NOT_FOUND
    assert nvml.nvmlDeviceGetHandleByPciBusId_v2(b"garbage", ctypes.byref(h)) == INVALID_ARGUMENT
    mig = node550["gpus"][0]["mig_devices"][1]
    assert nvml.nvmlDeviceGetHandleByUUID(mig["uuid"].encode(), ctypes.byref(h)) == SUCCESS
    assert nvml.uint("nvmlDeviceIsMigDeviceHandle", h) == (SUCCESS, 1)


def test_mig_devices(nvml, node550):
    h0, h1 = nvml.handle(0), nvml.handle(1)
    cur, pend = ctypes.c_uint(), ctypes.c_uint()
    assert nvml.nvmlDeviceGetMigMode(h0, ctypes.byref(cur), ctypes.byref(pend)) == SUCCESS
    assert (cur.value, pend.value) == (1, 1)
    assert nvml.nvmlDeviceGetMigMode(h1, ctypes.byref(cur), ctypes.byref(pend)) == SUCCESS and cur.value == 0
    assert nvml.uint("nvmlDeviceGetMaxMigDeviceCount", h0) == (SUCCESS, 7)
    assert nvml.uint("nvmlDeviceIsMigDeviceHandle", h0) == (SUCCESS, 0)
    for want in node550["gpus"][0]["mig_devices"]:
        rc, m = nvml.mig(h0, want["index"])
        assert rc == SUCCESS
        assert nvml.string("nvmlDeviceGetUUID", m) == want["uuid"]
        assert nvml.string("nvmlDeviceGetName", m) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
        assert nvml.uint("nvmlDeviceGetGpuInstanceId", m) == (SUCCESS, want["gi"])
        assert nvml.uint("nvmlDeviceGetComputeInstanceId", m) == (SUCCESS, want["ci"])
        assert nvml.uint("nvmlDeviceIsMigDeviceHandle", m) == (SUCCESS, 1)
        parent = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m, ctypes.byref(parent)) == SUCCESS
        assert parent.value == h0.value
        attrs = Attributes()
        assert nvml.nvmlDeviceGetAttributes_v2(m, ctypes.byref(attrs)) == SUCCESS
        assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (60, 3, 40448)
    assert nvml.mig(h0, 2)[0] == NOT_FOUND
    assert nvml.mig(h0, 7)[0] == INVALID_ARGUMENT
    assert nvml.mig(h1, 0)[0] == NOT_FOUND
    assert nvml.uint("nvmlDeviceGetGpuInstanceId", h0)[0] == NOT_SUPPORTED
    assert nvml.nvmlDeviceGetAttributes_v2(h0, ctypes.byref(Attributes())) == NOT_SUPPORTED
    parent = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h0, ctypes.byref(parent)) == INVALID_ARGUMENT


def test_gpu_and_compute_instances(nvml):
    h0 = nvml.handle(0)
    gi, ci = ctypes.c_void_p(), ctypes.c_void_p()
    assert nvml.nvmlDeviceGetGpuInstanceById(h0, 2, ctypes.byref(gi)) == SUCCESS
    info = GpuInstanceInfo()
    assert nvml.nvmlGpuInstanceGetInfo(gi, ctypes.byref(info)) == SUCCESS
    assert (info.device, info.id, info.profileId, info.start, info.size) == (h0.value, 2, 9, 4, 4)
    assert nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0, ctypes.byref(ci)) == SUCCESS
    cinfo = ComputeInstanceInfo()
    assert nvml.nvmlComputeInstanceGetInfo_v2(ci, ctypes.byref(cinfo)) == SUCCESS
    assert (cinfo.device, cinfo.gpuInstance, cinfo.id, cinfo.profileId) == (h0.value, gi.value, 0, 2)
    gis = (ctypes.c_void_p * 7)()
    count = ctypes.c_uint()
    assert nvml.nvmlDeviceGetGpuInstances(h0, 9, gis, ctypes.byref(count)) == SUCCESS and count.value == 2
    assert nvml.nvmlDeviceGetGpuInstanceById(h0, 5, ctypes.byref(gi)) == NOT_FOUND
    assert nvml.nvmlDeviceGetGpuInstanceById(nvml.handle(1), 1, ctypes.byref(gi)) == NOT_SUPPORTED


def test_bad_handles_never_crash(nvml):
    h = nvml.handle(0)
    buf = ctypes.create_string_buffer(96)
    bogus = [ctypes.c_void_p(None), ctypes.c_void_p(0x10), ctypes.c_void_p(h.value + 1),
             ctypes.c_void_p(h.value + 4096), ctypes.byref(buf)]
    for bad in bogus:
        assert nvml.nvmlDeviceGetName(bad, buf, 96) == INVALID_ARGUMENT
        assert nvml.nvmlDeviceGetUUID(bad, buf, 96) == INVALID_ARGUMENT
        assert nvml.uint("nvmlDeviceGetMinorNumber", bad)[0] == INVALID_ARGUMENT
        assert nvml.nvmlGpuInstanceGetInfo(bad, ctypes.byref(GpuInstanceInfo())) == INVALID_ARGUMENT
        assert nvml.nvmlComputeInstanceGetInfo(bad, ctypes.byref(ComputeInstanceInfo())) == INVALID_ARGUMENT
    assert nvml.nvmlDeviceGetName(h, None, 96) == INVALID_ARGUMENT
    assert nvml.nvmlDeviceGetName(h, buf, 3) == INSUFFICIENT_SIZE
    assert nvml.nvmlDeviceGetHandleByIndex_v2(8, ctypes.byref(ctypes.c_void_p())) == INVALID_ARGUMENT


def test_init_is_reference_counted(node550):
    n = Nvml(os.path.join(node550["roots"]["driver_root"], LIB64, "libnvidia-ml.so.1"))
    assert n.nvmlInit_v2() == SUCCESS and n.nvmlInitWithFlags(0) == SUCCESS
    assert n.nvmlShutdown() == SUCCESS
    assert n.count() == 8
    assert n.nvmlShutdown() == SUCCESS
    assert n.nvmlShutdown() == UNINITIALIZED
    assert n.nvmlDeviceGetCount_v2(ctypes.byref(ctypes.c_uint())) == UNINITIALIZED


def test_forced_init_error(nvml, monkeypatch):
    monkeypatch.setenv("NVCT_SIM_NVML_ERROR", "999")
    assert nvml.nvmlInit_v2() == 999
    monkeypatch.setenv("NVCT_SIM_NVML_ERROR", "9")
    assert nvml.nvmlInit() == DRIVER_NOT_LOADED


def test_view_follows_the_device_nodes_present(tmp_path, node550):
    """Like a container given GPUs 0 and 3 and the second MIG device of GPU 0."""
    root = make_root(tmp_path, node550, "partial", {
        "dev/nvidiactl": (195, 255), "dev/nvidia0": (195, 0), "dev/nvidia3": (195, 3),
        "dev/nvidia-caps/nvidia-cap21": (511, 21), "dev/nvidia-caps/nvidia-cap22": (511, 22),
        "dev/nvidia-caps/nvidia-cap12": (511, 12),  # MIG 0 lacks its CI cap: hidden
    })
    n = Nvml(str(root / LIB64 / "libnvidia-ml.so.1"))
    assert n.nvmlInit_v2() == SUCCESS
    assert n.count() == 2
    assert n.string("nvmlDeviceGetUUID", n.handle(0)) == node550["gpus"][0]["uuid"]
    assert n.string("nvmlDeviceGetUUID", n.handle(1)) == node550["gpus"][3]["uuid"]
    assert n.uint("nvmlDeviceGetIndex", n.handle(1)) == (SUCCESS, 1)
    assert n.uint("nvmlDeviceGetMinorNumber", n.handle(1)) == (SUCCESS, 3)
    rc, m = n.mig(n.handle(0), 0)
    assert rc == SUCCESS
    assert n.string("nvmlDeviceGetUUID", m) == node550["gpus"][0]["mig_devices"][1]["uuid"]
    assert n.mig(n.handle(0), 1)[0] == NOT_FOUND
    h = ctypes.c_void_p()
    hidden = node550["gpus"][1]["uuid"].encode()
    assert n.nvmlDeviceGetHandleByUUID(hidden, ctypes.byref(h)) == NOT_FOUND
    assert n.nvmlShutdown() == SUCCESS

    out = smi(root, "-L")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {node550['gpus'][0]['uuid']})",
        f"  MIG 3g.40gb     Device  0: (UUID: {node550['gpus'][0]['mig_devices'][1]['uuid']})",
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {node550['gpus'][3]['uuid']})",
    ]


def test_no_nvidiactl_means_driver_not_loaded(tmp_path, node550):
    root = make_root(tmp_path, node550, "noctl", {"dev/nvidia0": (195, 0)})
    n = Nvml(str(root / LIB64 / "libnvidia-ml.so.1"))
    assert n.nvmlInit_v2() == DRIVER_NOT_LOADED
    out = smi(root)
    assert (out.returncode, out.stdout) == (9, NO_DRIVER + "\n")


def test_no_gpus_visible(tmp_path, node550):
    root = make_root(tmp_path, node550, "ctlonly", {"dev/nvidiactl": (195, 255)})
    out = smi(root, "-L")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")


# --- nvidia-smi on the node ---

def test_nvidia_smi_list(node550):
    expected = []
    for g in node550["gpus"]:
        expected.append(f"GPU {g['index']}: {g['model']} (UUID: {g['uuid']})")
        expected += [f"  MIG {d['profile']:<11} Device {d['index']:>2}: (UUID: {d['uuid']})" for d in g["mig_devices"]]
    out = smi(node550["roots"]["driver_root"], "-L")
    assert out.returncode == 0 and out.stdout.splitlines() == expected
    assert out.stdout.splitlines()[1].startswith("  MIG 3g.40gb     Device  0: (UUID: MIG-")


def test_nvidia_smi_table(node550):
    out = smi(node550["roots"]["driver_root"])
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert "| NVIDIA-SMI 550.54.15" in lines[2] and "CUDA Version: 12.4" in lines[2]
    assert all(len(ln) == 91 for ln in lines[1:] if ln.startswith(("|", "+")))
    assert sum("NVIDIA H100 80GB HBM3" in ln for ln in lines) == 8
    assert "No running processes found" in out.stdout


def test_nvidia_smi_query_and_errors(node550):
    root = node550["roots"]["driver_root"]
    out = smi(root, "--query-gpu=index,uuid,pci.bus_id,mig.mode.current", "--format=csv,noheader")
    assert out.stdout.splitlines()[0] == f"0, {node550['gpus'][0]['uuid']}, 00000000:1B:00.0, Enabled"
    assert len(out.stdout.splitlines()) == 8
    out = smi(root, "--query-gpu=bogus", "--format=csv")
    assert out.returncode == 2 and 'Field "bogus" is not a valid field to query.' in out.stdout
    out = smi(root, "-L", env={"NVCT_SIM_NVML_ERROR": "9"})
    assert (out.returncode, out.stdout) == (9, NO_DRIVER + "\n")
    out = smi(root, "-L", env={"NVCT_SIM_NVML_ERROR": "999"})
    assert (out.returncode, out.stdout) == (255, "Failed to initialize NVML: Unknown Error\n")


def test_nvidia_smi_without_mig(node535):
    out = smi(node535["roots"]["driver_root"], "-L")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 8 and "MIG" not in out.stdout


def test_nvidia_smi_64_gpus(node64):
    out = smi(node64["roots"]["driver_root"], "-L")
    assert out.returncode == 0
    assert sum(ln.startswith("GPU ") for ln in out.stdout.splitlines()) == 64


# --- libcuda ---

def test_libcuda_counts_gpus_and_mig_devices(node550):
    cuda = ctypes.CDLL(os.path.join(node550["roots"]["driver_root"], LIB64, "libcuda.so.1"))
    count, version = ctypes.c_int(), ctypes.c_int()
    assert cuda.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 12040
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    assert count.value == 7 + 2  # 7 whole GPUs + GPU 0's two MIG devices
    name = ctypes.create_string_buffer(96)
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDeviceGetName(name, 96, dev) == 0 and name.value == b"NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert cuda.cuDeviceGetName(name, 96, 2) == 0 and name.value == b"NVIDIA H100 80GB HBM3"
    uuid = (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGetUuid(uuid, 2) == 0
    assert bytes(uuid).hex() == node550["gpus"][1]["uuid"][4:].replace("-", "")
    assert cuda.cuDeviceGet(ctypes.byref(dev), 9) == 101  # CUDA_ERROR_INVALID_DEVICE


def test_libcuda_without_driver(tmp_path, node550):
    root = make_root(tmp_path, node550, "nocuda", {})
    shutil.copy(os.path.join(node550["roots"]["driver_root"], LIB64, "libcuda.so.550.54.15"),
                root / LIB64 / "libcuda.so.1")
    cuda = ctypes.CDLL(str(root / LIB64 / "libcuda.so.1"))
    assert cuda.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE


def test_only_nvml_symbols_are_exported(node550):
    out = subprocess.run(["nm", "-D", "--defined-only",
                          os.path.join(node550["roots"]["driver_root"], LIB64, "libnvidia-ml.so.1")],
                         capture_output=True, text=True, check=True).stdout
    symbols = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert symbols and all(s.startswith("nvml") for s in symbols)
    for required in ("nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
                     "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount_v2",
                     "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
                     "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMemoryInfo_v2",
                     "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
                     "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetAttributes_v2",
                     "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlGpuInstanceGetComputeInstanceProfileInfoV"):
        assert required in symbols


# --- graphics MIG profiles (+gfx): the v3 profile info's capabilities ---

GFX_TOPOLOGY = os.path.join(os.path.dirname(__file__), "..", "..", "nvct", "simulate", "rtx-pro-6000.json")
GI_PROFILE_CAPS_GFX = 2


class GiProfileInfoV3(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint)] + [(n, ctypes.c_uint) for n in (
        "sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount", "decoderCount", "encoderCount",
        "jpegCount", "ofaCount")] + [("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96),
                                     ("capabilities", ctypes.c_uint)]


class GiProfileInfoV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("isP2pSupported", ctypes.c_uint)] + [
        (n, ctypes.c_uint) for n in ("sliceCount", "instanceCount", "multiprocessorCount", "copyEngineCount",
                                     "decoderCount", "encoderCount", "jpegCount", "ofaCount")] + [
        ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96)]


@pytest.fixture(scope="module")
def gfx_nvml(tmp_path_factory):
    from nvct.simulate.node import cached_node

    node = cached_node(tmp_path_factory.getbasetemp() / "sim", topology=os.path.abspath(GFX_TOPOLOGY))
    n = Nvml(os.path.join(node["roots"]["driver_root"], LIB64, "libnvidia-ml.so.1"))
    assert n.nvmlInit_v2() == SUCCESS
    yield n
    assert n.nvmlShutdown() == SUCCESS


def _profile(n, cls, version, profile):
    info = cls()
    info.version = ctypes.sizeof(cls) | (version << 24)
    return n.nvmlDeviceGetGpuInstanceProfileInfoV(n.handle(0), profile, ctypes.byref(info)), info


def test_v3_profile_info_says_which_profiles_have_graphics(gfx_nvml):
    assert ctypes.sizeof(GiProfileInfoV3) == ctypes.sizeof(GiProfileInfoV2) == 152  # as nvml.h's
    seen = {}
    for profile in range(18):
        rc, info = _profile(gfx_nvml, GiProfileInfoV3, 3, profile)
        if rc == SUCCESS:
            assert info.version >> 24 == 3
            seen[info.name.decode()] = bool(info.capabilities & GI_PROFILE_CAPS_GFX)
        else:
            assert rc == NOT_SUPPORTED
    assert seen == {"MIG 1g.24gb": False, "MIG 2g.48gb": False, "MIG 4g.96gb": False, "MIG 1g.24gb+me": False,
                    "MIG 1g.24gb+gfx": True, "MIG 2g.48gb+gfx": True, "MIG 4g.96gb+gfx": True}


def test_v2_profile_info_still_answers_and_other_versions_do_not(gfx_nvml):
    rc, info = _profile(gfx_nvml, GiProfileInfoV2, 2, 10)  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
    assert rc == SUCCESS and info.name == b"MIG 1g.24gb+gfx" and info.id == 47
    assert _profile(gfx_nvml, GiProfileInfoV3, 4, 10)[0] == ARGUMENT_VERSION_MISMATCH


def test_the_default_node_has_no_graphics_profile(nvml):
    for profile in range(18):
        rc, info = _profile(nvml, GiProfileInfoV3, 3, profile)
        assert rc == NOT_SUPPORTED or not info.capabilities & GI_PROFILE_CAPS_GFX
