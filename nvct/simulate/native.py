"""Compiling the node's ELF files: driver libraries, the mock NVML, binaries.

Every stub library of a driver version links the same compiled object (only
SONAME and DT_NEEDED differ), so a node costs a handful of compiles and a
few dozen fast links, run in parallel. Outputs are cached for the life of
the process: the next node with the same driver version (and topology, for
NVML) only copies files.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nvct.base.errors import NvctError
from nvct.simulate.driver import Driver, Library
from nvct.simulate.topology import Topology

CSRC = os.path.join(os.path.dirname(__file__), "csrc")
_GLIBC = ("libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
_CFLAGS = ("-std=gnu99", "-O1", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter")

_lock = threading.Lock()
_cache_dir: str | None = None


@dataclass
class Artifacts:
    """Paths (in the process cache) of everything compiled for one node."""

    libraries: dict = field(default_factory=dict)   # (arch, library name) -> path
    xorg: dict = field(default_factory=dict)        # file name -> path
    binaries: dict = field(default_factory=dict)    # binary name -> path


@dataclass
class _Job:
    out: str
    argv: list
    deps: tuple = ()       # outputs of other jobs this one links against


def build(drv: Driver, topo: Topology, binaries: tuple, arch: str = "x86_64") -> Artifacts:
    """Compile (or reuse) every ELF file of a node of architecture ``arch``."""
    with _lock:
        return _Builder(drv, topo, arch).run(binaries)


def compiler(arch: str) -> tuple[str, ...]:
    """The C compiler command for ``arch``: gcc for x86-64; for aarch64 Debian's cross gcc, else clang.

    Debian's gcc-multilib (the i386 libraries) conflicts with every gcc cross
    compiler, so clang with the cross sysroot (libc6-dev-arm64-cross) is what
    a machine that builds both kinds of node has.
    """
    if arch == "x86_64":
        return ("gcc",)
    if arch == "aarch64":
        if shutil.which("aarch64-linux-gnu-gcc"):
            return ("aarch64-linux-gnu-gcc",)
        if shutil.which("clang") and os.path.isdir("/usr/aarch64-linux-gnu/lib"):
            return ("clang", "--target=aarch64-linux-gnu")
        raise NvctError("building an aarch64 node needs aarch64-linux-gnu-gcc, or clang with the aarch64 sysroot "
                        "(Debian: apt-get install clang libc6-dev-arm64-cross libgcc-12-dev-arm64-cross "
                        "binutils-aarch64-linux-gnu)")
    raise NvctError(f"simulated node architecture {arch!r}: expected x86_64 or aarch64")


class _Builder:
    def __init__(self, drv: Driver, topo: Topology, arch: str = "x86_64"):
        self.drv = drv
        self.topo = topo
        self.arch = arch
        self.cc = compiler(arch)
        self.root = os.path.join(_cache(), arch, drv.version)
        self.jobs: dict[str, _Job] = {}
        ver = f'-DSIM_DRIVER_VERSION="{drv.version}"'
        self.defines = (ver, f"-DSIM_CUDA_VERSION={drv.cuda_version}")

    def run(self, binaries: tuple) -> Artifacts:
        art = Artifacts()
        objs = self._objects()
        libc32 = self._glibc32(objs) if self.arch == "x86_64" else {}
        by_name = {lib.name: lib for lib in self.drv.libraries()}
        for lib in by_name.values():
            if lib.name != "libnvidia-ml":  # the mock below, not a stub
                art.libraries[(self.arch, lib.name)] = self._library(lib, self.arch, objs, by_name, libc32)
            if lib.i386 and self.arch == "x86_64":  # no 32-bit libraries on arm64
                art.libraries[("i386", lib.name)] = self._library(lib, "i386", objs, by_name, libc32)
        nvml = self._nvml(objs)
        art.libraries[(self.arch, "libnvidia-ml")] = nvml
        art.xorg = self._xorg(objs)
        for name in binaries:
            art.binaries[name] = self._binary(name, objs, nvml)
        self._execute()
        return art

    # --- targets ---

    def _add(self, out: str, argv: list, deps: tuple = ()) -> str:
        if out not in self.jobs and not os.path.exists(out):
            self.jobs[out] = _Job(out, argv, deps)
        return out

    def _objects(self) -> dict:
        obj = os.path.join(self.root, "obj")
        gen = os.path.join(self.root, f"nvml-{self.topo.sha256[:16]}")
        os.makedirs(obj, exist_ok=True)
        os.makedirs(gen, exist_ok=True)
        header = os.path.join(gen, "simtopo_data.h")
        if not os.path.exists(header):
            _write(header, topology_header(self.drv, self.topo))

        def cc(src, out, *extra, m32=False):
            flags = ["-m32"] if m32 else []
            return self._add(out, [*self.cc, *flags, *_CFLAGS, *self.defines, *extra, "-I", CSRC, "-c",
                                   os.path.join(CSRC, src), "-o", out])

        objs = {"stub32": None, "note32": None}
        if self.arch == "x86_64":
            objs["stub32"] = cc("stub.c", os.path.join(obj, "stub32.o"), m32=True)
            objs["note32"] = cc("abi_note.c", os.path.join(obj, "note32.o"), m32=True)
        return {
            **objs,
            "stub64": cc("stub.c", os.path.join(obj, "stub64.o")),
            "note64": cc("abi_note.c", os.path.join(obj, "note64.o")),
            "cuda": cc("cuda.c", os.path.join(obj, "cuda.o")),
            "smi": cc("smi.c", os.path.join(obj, "smi.o")),
            "tool": cc("tool.c", os.path.join(obj, "tool.o")),
            "nvml": cc("nvml.c", os.path.join(gen, "nvml.o"), "-I", gen),
            "gen": gen,
        }

    def _glibc32(self, objs: dict) -> dict:
        """Stub 32-bit glibc libraries: linking against them tags our i386 libs 'libc6'."""
        d = os.path.join(self.root, "glibc32")
        os.makedirs(d, exist_ok=True)
        out = {}
        for soname in ("libc.so.6",) + _GLIBC:
            path = os.path.join(d, soname)
            out[soname] = self._add(path, ["gcc", "-m32", "-shared", "-nostdlib", f"-Wl,-soname,{soname}",
                                           objs["stub32"], "-o", path], (objs["stub32"],))
        return out

    def _library(self, lib: Library, arch: str, objs: dict, by_name: dict, libc32: dict) -> str:
        d = os.path.join(self.root, arch, lib.subdir)
        os.makedirs(d, exist_ok=True)
        out = os.path.join(d, self.drv.file_name(lib))
        m32 = arch == "i386"
        inputs = [objs["stub32" if m32 else "stub64"]]
        if lib.name == "libnvidia-tls":
            inputs.append(objs["note32" if m32 else "note64"])
        if lib.name == "libcuda" and not m32:
            inputs = [objs["cuda"]]
        deps = []
        for need in lib.needed:
            if need in by_name:
                deps.append(self._library(by_name[need], arch, objs, by_name, libc32))
            else:
                deps.append(libc32[need] if m32 else _glibc64(need, self.cc))
        argv = [*self.cc, "-shared", f"-Wl,-soname,{self.drv.soname(lib)}", "-Wl,--no-as-needed", *inputs, *deps]
        if m32:
            argv[len(self.cc):len(self.cc)] = ["-m32", "-nostdlib"]
            argv.append(libc32["libc.so.6"])
            deps.append(libc32["libc.so.6"])
        elif lib.name != "libcuda":
            # Data-only stubs need no start files: linking libc by path is twice as fast.
            argv[len(self.cc):len(self.cc)] = ["-nostdlib"]
            argv.append(_glibc64("libc.so.6", self.cc))
        return self._add(out, argv + ["-o", out], tuple(inputs) + tuple(deps))

    def _nvml(self, objs: dict) -> str:
        out = os.path.join(objs["gen"], f"libnvidia-ml.so.{self.drv.version}")
        deps = [_glibc64(n, self.cc) for n in ("libpthread.so.0", "libm.so.6", "libdl.so.2")]
        return self._add(out, [*self.cc, "-shared", "-Wl,-soname,libnvidia-ml.so.1", "-Wl,--no-as-needed",
                               objs["nvml"], *deps, "-o", out], (objs["nvml"],))

    def _xorg(self, objs: dict) -> dict:
        d = os.path.join(self.root, "xorg")
        os.makedirs(d, exist_ok=True)
        drv_so = os.path.join(d, "nvidia_drv.so")
        glx = os.path.join(d, f"libglxserver_nvidia.so.{self.drv.version}")
        return {
            "nvidia_drv.so": self._add(drv_so, [*self.cc, "-shared", objs["stub64"], "-o", drv_so], (objs["stub64"],)),
            os.path.basename(glx): self._add(glx, [*self.cc, "-shared", f"-Wl,-soname,{os.path.basename(glx)}",
                                                   objs["stub64"], "-o", glx], (objs["stub64"],)),
        }

    def _binary(self, name: str, objs: dict, nvml: str) -> str:
        d = os.path.join(self.root, "bin")
        os.makedirs(d, exist_ok=True)
        if name == "nvidia-smi":
            # Linked against whichever NVML came first: the binary does not depend on the topology.
            out = os.path.join(d, name)
            return self._add(out, [*self.cc, objs["smi"], "-Wl,--no-as-needed", nvml, "-o", out], (objs["smi"], nvml))
        out = os.path.join(d, "tool")
        return self._add(out, [*self.cc, objs["tool"], "-o", out], (objs["tool"],))

    # --- running ---

    def _execute(self) -> None:
        pending = dict(self.jobs)
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            while pending:
                ready = [j for j in pending.values() if not any(d in pending for d in j.deps)]
                if not ready:  # pragma: no cover - the graph above has no cycles
                    raise NvctError("simulated node: circular build dependencies")
                for job, err in zip(ready, pool.map(_run, ready)):
                    if err:
                        raise NvctError(f"building {os.path.basename(job.out)} for the simulated node failed: {err}")
                for job in ready:
                    del pending[job.out]


def topology_header(drv: Driver, topo: Topology) -> str:
    """C tables of the topology for the mock NVML (simtopo_data.h)."""
    profiles: list = []
    profile_at: dict = {}
    for key, plist in topo.profiles.items():
        profile_at[key] = (len(profiles), len(plist))
        profiles.extend(plist)
    lines = [
        "/* Generated by nvct simulate from the node topology; do not edit. */",
        f"#define SIM_DRIVER_VERSION {_c(drv.version)}",
        f"#define SIM_NVML_VERSION {_c(drv.nvml_version)}",
        f"#define SIM_CUDA_VERSION {drv.cuda_version}",
        f"#define SIM_NGPUS {len(topo.gpus)}",
        f"#define SIM_NMIGS {len(topo.mig_devices)}",
        f"#define SIM_NPROFILES {len(profiles)}",
        "",
        "static const struct sim_profile sim_profiles[SIM_NPROFILES + 1] = {",
    ]
    for p in profiles:
        lines.append(f"    {{ {p.profile}, {p.id}, {p.slices}, {p.max}, {p.multiprocessors}, {p.memory_mib}ULL, "
                     f"{p.ci_profile}, {_c(p.name)}, {2 if p.gfx else 0} }},")
    lines += ["};", "", "static const struct sim_gpu sim_gpus[SIM_NGPUS + 1] = {"]
    first_mig = 0
    for g in topo.gpus:
        pfirst, pcount = profile_at.get(g.model, (0, 0))
        lines.append(
            f"    {{ .minor = {g.minor}, .uuid = {_c(g.uuid)}, .name = {_c(g.name)}, .domain = {g.domain}, "
            f".bus = {g.bus}, .device = {g.device}, .function = {g.function}, "
            f".pci_device_id = {g.pci_device_id:#x}, .pci_subsystem_id = {g.pci_subsystem_id:#x}, "
            f".brand = {g.brand}, .architecture = {g.architecture}, .cc_major = {g.cc_major}, "
            f".cc_minor = {g.cc_minor}, .memory_mib = {g.memory_mib}ULL, .reserved_mib = {g.reserved_mib}ULL, "
            f".multiprocessors = {g.multiprocessors}, .cores = {g.cores}, .vbios = {_c(g.vbios)}, "
            f".board_part_number = {_c(g.board_part_number)}, .serial = {_c(g.serial)}, "
            f".power_limit_mw = {g.power_limit_mw}, .mig_capable = {int(g.mig_capable)}, "
            f".mig_enabled = {int(g.mig_enabled)}, .persistence_mode = {int(g.persistence_mode)}, "
            f".max_mig_devices = {g.max_mig_devices}, "
            f".mig_first = {first_mig}, .mig_count = {len(g.mig_devices)}, "
            f".profile_first = {pfirst}, .profile_count = {pcount} }},")
        first_mig += len(g.mig_devices)
    lines += ["};", "", "static const struct sim_mig sim_migs[SIM_NMIGS + 1] = {"]
    for gi, g in enumerate(topo.gpus):
        for m in g.mig_devices:
            lines.append(
                f"    {{ .gpu = {gi}, .gi = {m.gi}, .ci = {m.ci}, .gi_profile = {m.gi_profile}, "
                f".gi_profile_id = {m.gi_profile_id}, .ci_profile = {m.ci_profile}, "
                f".placement_start = {m.placement_start}, .placement_size = {m.placement_size}, "
                f".slices = {m.slices}, .multiprocessors = {m.multiprocessors}, .memory_mib = {m.memory_mib}ULL, "
                f".uuid = {_c(m.uuid)}, .name = {_c(m.name)}, .profile_name = {_c(m.profile)}, "
                f".gi_cap_minor = {m.gi_cap_minor}, .ci_cap_minor = {m.ci_cap_minor} }},")
    lines += ["};", ""]
    return "\n".join(lines)


def _c(s: str) -> str:
    """A C string literal (topology strings are printable ASCII)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("?", "\\?") + '"'


def _run(job: _Job) -> str | None:
    tmp = f"{job.out}.tmp{os.getpid()}.{threading.get_ident()}"
    argv = [tmp if a == job.out else a for a in job.argv]
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return "gcc not found (building a simulated node needs gcc; for i386 libraries gcc-multilib)"
    if proc.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else f"gcc exited with status {proc.returncode}"
    os.replace(tmp, job.out)
    return None


@functools.lru_cache(maxsize=None)
def _glibc64(soname: str, cc: tuple = ("gcc",)) -> str:
    """The compiler's glibc library ``soname`` by path (link by path: no -l name games)."""
    try:
        path = subprocess.run([*cc, f"-print-file-name={soname}"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True).stdout.strip()
    except FileNotFoundError:
        raise NvctError(f"building a simulated node needs {cc[0]} (not found on PATH)") from None
    if os.path.isabs(path) and os.path.exists(path):
        return os.path.normpath(path)
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64") if cc == ("gcc",) else ():
        if os.path.exists(os.path.join(d, soname)):
            return os.path.join(d, soname)
    raise NvctError(f"building a simulated node: glibc's {soname} not found")


def _cache() -> str:
    global _cache_dir
    if _cache_dir is None:
        _cache_dir = tempfile.mkdtemp(prefix="nvct-simulate-")
        atexit.register(shutil.rmtree, _cache_dir, True)
    return _cache_dir


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)
