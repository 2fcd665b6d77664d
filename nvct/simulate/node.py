"""Building a simulated GPU node: a directory any tool takes for a driver install.

DIR serves as driver root and dev root, DIR/proc as proc root, and
DIR/nvct-config.toml points nvct at all three. The node is assembled in a
staging directory inside DIR and moved into place only once complete, so a
failed build leaves DIR as it was; DIR/nvct-node.json, written last, marks a
finished node and records the ground truth tests compare against.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading

from nvct.base.errors import NvctError
from nvct.base.fileutil import write_atomic
from nvct.simulate import datafiles, devices, ldcache, manifest as _manifest, native, procfs, topology as _topology
from nvct.simulate.driver import ARCHES, BINARIES, DEFAULT_DRIVER_VERSION, LIB_DIRS, Driver, driver
from nvct.simulate.manifest import CONFIG, MANIFEST, load_manifest

#: What a node puts at the top of DIR (besides the manifest); a rebuild removes exactly these.
TOP_LEVEL = ("usr", "etc", "lib", "dev", "proc", "run", "var", "tmp", CONFIG)
_STAGING_PREFIX = ".nvct-build-"
#: The default topology of each architecture but x86-64's (a DGX H100): a Grace Hopper node.
_DEFAULT_TOPOLOGY = {"aarch64": os.path.join(os.path.dirname(__file__), "gh200.json")}
_cached_lock = threading.Lock()


def build_node(directory: str | os.PathLike, *, driver_version: str = DEFAULT_DRIVER_VERSION,
               topology=None, gpus: int | None = None, mig: bool = True, device_nodes: bool = True,
               force: bool = False, arch: str = "x86_64") -> dict:
    """Build a simulated node at ``directory`` and return its manifest.

    ``topology`` is a dict, a JSON file, or None for the default DGX H100.
    ``directory`` must be absent, empty, or a previous simulated node (which
    is replaced); ``force`` builds into another directory when none of the
    node's top-level names exist there. ``device_nodes=False`` skips mknod
    (no root needed; NVML then reports the driver as not loaded). ``arch``
    ``aarch64`` builds an arm64 node (a Grace machine's: its ELF files
    cross-compiled, its ld cache written by an aarch64 ldconfig).
    """
    target = os.path.abspath(os.fspath(directory))
    _check_arch(arch)
    drv = driver(driver_version)
    raw, source = _topology.load(topology if topology is not None else _DEFAULT_TOPOLOGY.get(arch))
    topo = _topology.resolve(raw, gpus=gpus, mig=mig, source=source)
    if device_nodes and os.geteuid() != 0:
        raise NvctError(devices.NEEDS_ROOT)
    previous = _check_target(target, force)
    os.makedirs(target, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=target)
    try:
        _populate(staging, target, drv, topo, device_nodes, arch)
        ldcache.generate(staging, arch)
        options = _options(driver_version, topology, gpus, mig, device_nodes, topo, arch)
        manifest = _manifest.build(target, drv, topo, options, device_nodes, list(TOP_LEVEL), ldcache_root=staging,
                                   arch=arch)
        _install(staging, target, previous)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.rmdir(staging)
    write_atomic(os.path.join(target, MANIFEST), json.dumps(manifest, indent=2) + "\n", mode=0o644)
    return manifest


def cached_node(base_dir: str | os.PathLike, **options) -> dict:
    """A node for these ``build_node`` options under ``base_dir``, built only once.

    For test fixtures: same options, same directory, and an existing
    complete node is reused (within and across processes).
    """
    drv = driver(options.get("driver_version", DEFAULT_DRIVER_VERSION))
    topology = options.get("topology")
    raw, source = _topology.load(topology if topology is not None else _DEFAULT_TOPOLOGY.get(options.get("arch") or ""))
    topo = _topology.resolve(raw, gpus=options.get("gpus"), mig=options.get("mig", True), source=source)
    wanted = _options(drv.version, options.get("topology"), options.get("gpus"), options.get("mig", True),
                      options.get("device_nodes", True), topo, options.get("arch", "x86_64"))
    key = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(os.fspath(base_dir), f"node-{key}")
    with _cached_lock:
        try:
            existing = load_manifest(directory)
            if existing.get("options") == wanted:
                return existing
        except NvctError:
            pass
        return build_node(directory, **options)


def _options(driver_version, topology, gpus, mig, device_nodes, topo, arch="x86_64") -> dict:
    source = "default" if topology is None else ("dict" if isinstance(topology, dict) else os.fspath(topology))
    out = {"driver_version": driver_version, "gpus": gpus, "mig": mig, "device_nodes": device_nodes,
           "topology": source, "topology_sha256": topo.sha256}
    if arch != "x86_64":  # x86-64 nodes' options (and cache keys) as before
        out["arch"] = arch
    return out


def _check_arch(arch: str) -> None:
    if arch not in ARCHES:
        raise NvctError(f"simulated node architecture {arch!r}: expected one of {', '.join(ARCHES)}")


def _check_target(target: str, force: bool):
    """None for a fresh directory, else the names to remove before installing."""
    if os.path.realpath(target) == "/":
        raise NvctError("refusing to build a simulated node at /")
    if not os.path.lexists(target):
        return None
    if not os.path.isdir(target):
        raise NvctError(f"{target}: exists and is not a directory")
    content = [n for n in os.listdir(target) if not n.startswith(_STAGING_PREFIX)]
    if not content:
        return None
    try:
        old = load_manifest(target)
    except NvctError:
        old = None
    if old is not None and old.get("roots", {}).get("driver_root") == target:
        return [n for n in old.get("top_level", []) if n in TOP_LEVEL]
    if not force:
        raise NvctError(f"{target}: directory is not empty and not a simulated node "
                        "(use --force to build into it anyway)")
    for name in TOP_LEVEL + (MANIFEST,):
        if os.path.lexists(os.path.join(target, name)):
            raise NvctError(f"{os.path.join(target, name)} already exists: remove it or use an empty directory")
    return []


def _install(staging: str, target: str, previous) -> None:
    if previous:
        manifest = os.path.join(target, MANIFEST)
        if os.path.lexists(manifest):
            os.unlink(manifest)
        for name in previous:
            _remove(os.path.join(target, name))
    for name in TOP_LEVEL:
        os.rename(os.path.join(staging, name), os.path.join(target, name))


def _remove(path: str) -> None:
    """Delete a previous node's entry, never following links or crossing mounts."""
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.ismount(full):
                raise NvctError(f"{full} is a mount point: unmount it before rebuilding the simulated node")
    shutil.rmtree(path)


def _populate(root: str, target: str, drv: Driver, topo, device_nodes: bool, arch: str = "x86_64") -> None:
    art = native.build(drv, topo, tuple(BINARIES), arch)
    _libraries(root, drv, art, arch)
    _xorg(root, drv, art)
    bindir = os.path.join(root, "usr/bin")
    os.makedirs(bindir)
    for name, src in art.binaries.items():
        _copy(src, os.path.join(bindir, name), 0o755)
    for rel, text in {**ldcache.ld_so_conf(arch), **datafiles.text_files(drv)}.items():
        _write(os.path.join(root, rel), text.encode())
    for rel, data in datafiles.binary_files(drv).items():
        _write(os.path.join(root, rel), data)
    procfs.write(os.path.join(root, "proc"), drv, topo, arch)
    os.makedirs(os.path.join(root, "dev"))
    if device_nodes:
        devices.create(root, topo, devices.plan(topo))
    datafiles.make_sockets(root)
    os.makedirs(os.path.join(root, "var"))
    os.symlink("../run", os.path.join(root, "var/run"))
    os.makedirs(os.path.join(root, datafiles.MPS_DIR.lstrip("/")))
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    _write(os.path.join(root, CONFIG), _config(target).encode())


def _libraries(root: str, drv: Driver, art: native.Artifacts, node_arch: str = "x86_64") -> None:
    by_name = {lib.name: lib for lib in drv.libraries()}
    for (arch, name), src in art.libraries.items():
        lib = by_name[name]
        directory = os.path.join(root, LIB_DIRS[arch].lstrip("/"), lib.subdir)
        os.makedirs(directory, exist_ok=True)
        file_name, soname = drv.file_name(lib), drv.soname(lib)
        _copy(src, os.path.join(directory, file_name), 0o644)
        if soname != file_name:
            os.symlink(file_name, os.path.join(directory, soname))
        if lib.dev_link:
            os.symlink(soname, os.path.join(directory, f"{lib.name}.so"))
    if "libnvidia-allocator" in by_name and drv.branch >= 495:
        gbm = os.path.join(root, LIB_DIRS[node_arch].lstrip("/"), "gbm")
        os.makedirs(gbm)
        os.symlink("../libnvidia-allocator.so.1", os.path.join(gbm, "nvidia-drm_gbm.so"))


def _xorg(root: str, drv: Driver, art: native.Artifacts) -> None:
    modules = os.path.join(root, "usr/lib/xorg/modules")
    for name, src in art.xorg.items():
        sub = "drivers" if name == "nvidia_drv.so" else "extensions"
        os.makedirs(os.path.join(modules, sub), exist_ok=True)
        _copy(src, os.path.join(modules, sub, name), 0o644)
        if sub == "extensions":
            os.symlink(name, os.path.join(modules, sub, "libglxserver_nvidia.so"))


def _config(target: str) -> str:
    q = json.dumps  # a JSON string is a valid TOML basic string
    return (f"# nvct configuration for the simulated GPU node at {q(target)}\n"
            f"# (written by `nvct simulate node`). Use it with\n"
            f"#   NVIDIA_CTK_CONFIG_FILE_PATH={q(os.path.join(target, CONFIG))}\n\n"
            f"[nvidia-container-cli]\nroot = {q(target)}\n\n"
            f"[nvct]\ndev-root = {q(target)}\nproc-root = {q(os.path.join(target, 'proc'))}\n")


def _copy(src: str, dst: str, mode: int) -> None:
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def _write(path: str, data: bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
