"""The in-container steps, each working only through the container's Rootfs.

Every path comes from the spec nvct wrote, but the rootfs itself belongs to
the image, so all file operations go through :class:`nvct.rootfs.root.Rootfs`,
which cannot be led outside the root by a symlink. The chain's steps share
one, opened once (``HookContext.root``): the root's own path is looked up a
single time, so it cannot be swapped between two steps.
"""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds
from nvct.hooks.container import HookContext

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Callable, Sequence

_COMPAT_DIR = "/usr/local/cuda/compat"
_COMPAT_CONF = "/etc/ld.so.conf.d/00-compat-nvct.conf"


def run(steps: Sequence[kinds.Step], ctx: HookContext) -> None:
    """The one executor: each step in order (the hook's chain, the shim's early steps, legacy's)."""
    for step in steps:
        if isinstance(step, kinds.Invalid):
            raise NvctError(step.error)
        if isinstance(step, kinds.Unknown):
            sys.stderr.write(f"nvct hook: unknown hook {step.name!r}, ignored (from a newer nvct?)\n")
            continue
        _RUNNERS[type(step)](step, ctx)


def run_chain(args: list[str], ctx: HookContext) -> None:
    """Run ``name args... [-- name args...]...`` in order (nvct.edits.steps.parse reads them)."""
    run(kinds.parse(args), ctx)


def create_symlinks(step: kinds.CreateSymlinks, ctx: HookContext) -> None:
    """``--link target::linkpath``: the SONAME and dev links of the driver libraries.

    As ``ln -sf`` (the reference's rule): whatever the image has at a link path
    (a stub's ``libcuda.so.1``, a stale link) is replaced, or the container would
    load the image's copy or fail to start. Replacing works through the Rootfs,
    inside the root and on the mount the path names (never a directory).
    """
    if step.links:
        ctx.root.symlinks(list(step.links), replace=True)


def enable_cuda_compat(step: kinds.EnableCudaCompat, ctx: HookContext) -> None:
    """Prefer the image's CUDA forward-compat libcuda where :func:`compat_choice` says it works here."""
    root = ctx.root
    folder, _ = compat_choice(root, step)
    if folder is None:
        return
    ctx.extra_folders.insert(0, folder)
    root.write_file(_COMPAT_CONF, (folder + "\n").encode(), 0o644, replace=True)


def compat_choice(root, step: kinds.EnableCudaCompat) -> tuple[str | None, str]:
    """Whether the image's CUDA compat libcuda is to be used: (its folder's real path or None, why).

    The one rule (the shim, the hook and ``nvct explain`` ask it). The folder is
    ``--cuda-compat-container-root`` (default /usr/local/cuda/compat); its newest
    ``libcuda.so.X.Y[.Z]`` decides, by its ``.note.cuda.fwd_compatibility``
    (nvct.linux.elf.cuda_compat_note), as the reference does: with ``--host-driver-version``,
    the host's branch must be listed and the compat libcuda newer than the host's; else,
    with ``--host-cuda-version``, the note's CUDA version must be newer. nvct adds the
    note's device list: with ``--gpu-brand`` (NVML brand ids of the container's GPUs),
    every one must be listed. Without a note, a newer driver major decides (older
    compat packages carry none).
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
    branches = [b for b in note.get("Driver") or () if isinstance(b, int)]
    cuda = note.get("CUDA Version")
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
    devices = [d for d in note.get("Device") or () if isinstance(d, int)]
    brands = step.gpu_brands
    if devices and brands:
        unlisted = sorted({b for b in brands if not (b.isascii() and b.isdigit() and int(b) in devices)})
        if unlisted:
            return None, (f"{path}: its CUDA compat note does not list the GPU brand(s) {', '.join(unlisted)} "
                          "of the container's GPUs (CUDA error 804 if used)")
    return root.realpath(folder), why


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


def update_ldcache(step: kinds.UpdateLdcache, ctx: HookContext) -> None:
    """Add ``--folder`` dirs to the container's ld.so.conf.d and run the host's static ldconfig.

    ``--library`` (nvct's, repeated): every name in those folders ldconfig
    would enter; the cache is then patched without running it. Not with a
    CUDA compat folder, whose libraries only ldconfig's scan finds.
    """
    from nvct.rootfs import ldconfig

    folders = ctx.extra_folders + [f for f in step.folders if f not in ctx.extra_folders]
    libraries = [] if ctx.extra_folders else list(step.libraries)
    if ctx.prepared is not None:  # the shim's: the cache it planned, from the driver's files on the host
        host_files, planned = ctx.prepared
        if not ldconfig.patch_ldcache(ctx.root, folders, libraries, host_files=host_files, planned=planned):
            from nvct.base.errors import ContainerError

            raise ContainerError(f"container root {ctx.rootfs}: its ld cache changed while the "
                                 "container was being created")
        return
    ldconfig.update_ldcache(ctx.root, folders, libraries=libraries, ldconfig=step.ldconfig_path or ldconfig.DEFAULT)
    musl_path(ctx.root, folders)


#: ``uname -m`` -> musl's name for the architecture (``ld-musl-<arch>.so.1``).
_MUSL_ARCH = {"ppc64le": "powerpc64le", "arm64": "aarch64"}
#: musl's built-in search path, which a path file replaces.
_MUSL_DEFAULT = ("/lib", "/usr/local/lib", "/usr/lib")


def musl_arch(root) -> str | None:
    """musl's name for this machine when the image is musl (its ``/lib/ld-musl-<arch>.so.1``), else None."""
    machine = os.uname().machine
    arch = _MUSL_ARCH.get(machine, machine)
    return arch if root.exists(f"/lib/ld-musl-{arch}.so.1") else None


def musl_path(root, folders: list[str]) -> None:
    """On a musl image (Alpine), put ``folders`` first in ``/etc/ld-musl-<arch>.path``.

    musl's loader reads no ld cache: it searches that file's folders (separated
    by newlines or colons), else its default path, which the file then has to
    keep. The image is musl when its root has ``/lib/ld-musl-<arch>.so.1``
    (looked up through the Rootfs, as every read here).
    """
    arch = musl_arch(root)
    if not folders or arch is None:
        return
    path = f"/etc/ld-musl-{arch}.path"
    current: tuple[str, ...] = _MUSL_DEFAULT
    if root.exists(path):
        text = root.read_file(path, limit=1 << 16).decode("utf-8", "replace")
        current = tuple(p for p in text.replace(":", "\n").split() if p.startswith("/"))
    entries = [*folders, *(p for p in current if p not in folders)]
    root.write_file(path, ("\n".join(entries) + "\n").encode(), 0o644, replace=True)


def create_soname_symlinks(step: kinds.CreateSonameSymlinks, ctx: HookContext) -> None:
    """``--folder F`` (repeated): SONAME links for the libraries in those folders (``ldconfig -n``).

    The reference's hook of that name, in specs some of its releases wrote.
    """
    from nvct.rootfs import ldconfig

    ldconfig.create_soname_links(ctx.root, list(step.folders), ldconfig=step.ldconfig_path or ldconfig.DEFAULT)


#: The driver's params, masked in every GPU container.
PARAMS = "/proc/driver/nvidia/params"


def disable_device_node_modification(step: kinds.MaskParams, ctx: HookContext) -> None:
    """Mask the driver's params with ``ModifyDeviceFiles: 0`` so libcuda never mknods in the container.

    Only the kernel's file (:func:`kernel_proc_path`); a volume under /proc is refused first.
    """
    from nvct.rootfs import mounttargets

    mounttargets.check_proc(ctx.spec, ctx.rootfs)
    root = ctx.root
    if not kernel_proc_path(root, PARAMS):
        return
    masked = masked_params(root.read_file(PARAMS))
    if masked is not None:
        root.mount_data(PARAMS, masked)


def kernel_proc_path(root, path: str) -> bool:
    """Whether ``path`` (under /proc) is there and is the kernel's: where a mask may go.

    The one rule for every mask nvct mounts under /proc (the chain's step, which the shim
    leaves to the hook, and legacy's view of /proc/driver/nvidia): every component from the root down is opened without
    following a link, and the last is on procfs, or is the very file this process
    sees at ``path`` (a simulated node's /proc/driver, a plain directory). False
    when it is not there; ContainerError for anything else (a link, a volume):
    a mask there would cover that file, and through a shared mount the host's.
    """
    import stat

    from nvct.base.errors import ContainerError
    from nvct.linux.fs import PROC_SUPER_MAGIC, fs_type

    fd = os.dup(root.fileno())
    try:
        for part in path.strip("/").split("/"):
            try:
                nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return False
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if stat.S_ISLNK(st.st_mode):
                raise ContainerError(f"{path} in container root {root.path}: reached through a symlink; "
                                     "refusing to mask it")
        if fs_type(fd) == PROC_SUPER_MAGIC:
            return True
        try:
            own = os.stat(path)
        except OSError:
            own = None
        if own is not None and (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            return True
        raise ContainerError(f"{path} in container root {root.path}: not on the kernel's procfs (a volume?); "
                             "refusing to mask it")
    finally:
        os.close(fd)


def masked_params(current: bytes) -> bytes | None:
    """The driver's params with ``ModifyDeviceFiles: 0``; None when they say so already."""
    text = current.decode(errors="replace")
    if "ModifyDeviceFiles: 0" in text:
        return None
    lines = [("ModifyDeviceFiles: 0" if line.startswith("ModifyDeviceFiles:") else line)
             for line in text.splitlines()]
    return ("\n".join(lines) + "\n").encode()


def chmod(step: kinds.Chmod, ctx: HookContext) -> None:
    """``--mode`` (octal, checked by the parser) on each ``--path``: e.g. device dirs that runc made 0700."""
    mode = int(step.mode, 8)
    root = ctx.root
    for path in step.paths:
        if root.exists(path):
            root.chmod(path, mode)


def bind_mount(step: kinds.BindMount, ctx: HookContext) -> None:
    """``--host-path H --container-path C [--options o,o]``: bind-mount a host path last.

    CDI consumers (podman, containerd, cri-o) sort a spec's mounts by depth,
    so a spec cannot keep a writable host directory (the MPS pipe dir) after
    the mounts an image symlink could lead into it: specs from ``nvct cdi
    generate`` mount it here instead, after every spec mount, through the
    Rootfs and its mount-boundary rule (docs/security.md).
    """
    import posixpath

    host, target = step.host_path, step.container_path
    for flag, path in (("--host-path", host), ("--container-path", target)):
        if not path.startswith("/"):
            raise NvctError(f"bind-mount: {flag} {path!r} is not an absolute path")
    flags = mount_flags(step.options, "bind-mount: --options")
    root = ctx.root
    # An existing target that an image symlink leads onto another mount (a volume
    # with shared propagation would carry our mount to the host) is refused too.
    probe = target if os.path.isdir(host) else posixpath.dirname(target)
    if root.exists(probe):
        root.check_same_mount(probe)
    root.bind_mount(host, target, **flags)


def readonly_root(step: kinds.ReadonlyRoot, ctx: HookContext) -> None:
    """Make the container's root read-only: the spec's ``root.readonly``, applied last.

    crun applies ``root.readonly`` before the createContainer hooks run, so no
    hook could create a link or the ld cache in a read-only container; the
    shim then leaves the root writable for the runtime and puts this step at
    the end of nvct's chain (runc applies it after the hooks itself).
    """
    ctx.root.remount_read_only()


#: Mount options a bind mount nvct makes understands, as ``Rootfs.bind_mount`` arguments.
_MOUNT_OPTIONS = {"ro": ("readonly", True), "rw": ("readonly", False), "nosuid": ("nosuid", True),
                  "nodev": ("nodev", True), "noexec": ("noexec", True), "bind": ("recursive", False),
                  "rbind": ("recursive", True), "private": ("private", False),
                  "rprivate": ("private", True)}


def mount_flags(options, what: str) -> dict[str, bool]:
    """CDI/OCI mount ``options`` -> keyword arguments of :meth:`nvct.rootfs.root.Rootfs.bind_mount`.

    Unlisted flags are off (suid, dev and exec allowed: say ``nosuid`` etc.), so a
    realized mount has exactly the options its edit names, as under runc.
    """
    out = {"readonly": False, "nosuid": False, "nodev": False, "noexec": False}
    for option in options:
        if not option:
            continue
        known = _MOUNT_OPTIONS.get(option)
        if known is None:
            raise NvctError(f"{what}: unknown mount option {option!r} "
                            f"(known: {', '.join(sorted(_MOUNT_OPTIONS))})")
        out[known[0]] = known[1]
    return out


def apply_cuda_memory_limits(step: kinds.ApplyCudaMemoryLimits, ctx: HookContext) -> None:
    """``--driver-root R --gpu-id UUID...``: the container's GPU memory request and limit, set by NVML.

    A createRuntime hook (the reference's): the container's process exists and
    is in its cgroup. With both ``NVIDIA_GPUkinds.MEMORY_REQUEST(S)`` and
    ``NVIDIA_GPUkinds.MEMORY_LIMIT(S)`` (MiB) in its env, each ``--gpu-id`` GPU gets
    them as soft and hard limits for the container's cgroup v2 directory
    (``nvmlDeviceSetMemoryLimits_v1``). The cgroup is the one the kernel lists
    for the container's process, so cgroupfs paths work as well as systemd's.
    """
    from nvct.base.errors import ContainerError
    from nvct.linux import cgroups

    env = _spec_env(ctx.spec)
    request = next((env[n] for n in kinds.MEMORY_REQUEST if n in env), None)
    limit = next((env[n] for n in kinds.MEMORY_LIMIT if n in env), None)
    if request is None and limit is None:
        return
    if request is None or limit is None:
        missing = kinds.MEMORY_REQUEST[1] if request is None else kinds.MEMORY_LIMIT[1]
        sys.stderr.write(f"apply-cuda-memory-limits: {missing} is not set; no GPU memory limit is applied\n")
        return
    soft, hard = _mib(kinds.MEMORY_REQUEST[1], request), _mib(kinds.MEMORY_LIMIT[1], limit)
    if soft > hard:
        raise NvctError(f"apply-cuda-memory-limits: the GPU memory request ({soft} MiB) exceeds the limit ({hard} MiB)")
    gpus = list(step.gpu_ids)
    if any(not g.strip() for g in gpus):
        raise NvctError("apply-cuda-memory-limits: --gpu-id must not be empty")
    if not gpus:
        return
    if ctx.pid is None:
        raise ContainerError("apply-cuda-memory-limits: the OCI state names no pid (run it as a createRuntime hook)")
    if cgroups.cgroup_version(ctx.pid) != 2:
        raise ContainerError("apply-cuda-memory-limits: GPU memory limits need cgroup v2 "
                             "(/sys/fs/cgroup is not cgroup2)")
    cgroup = cgroups.unified_cgroup_dir(ctx.pid)
    _set_memory_limits(step.driver_root or "/", gpus, cgroup, soft << 20, hard << 20)


def _set_memory_limits(driver_root: str, gpus: list[str], cgroup: str, soft: int, hard: int) -> None:
    from nvct.base.errors import DriverError
    from nvct.discover import nvml

    library = nvml.find_library(driver_root, None, os.uname().machine)
    if library is None:
        raise DriverError(f"apply-cuda-memory-limits: no libnvidia-ml.so.1 under the driver root {driver_root}")
    with nvml.Nvml(library) as lib:
        for uuid in gpus:
            lib.set_memory_limits(lib.handle_by_uuid(uuid), cgroup, soft, hard)


def _spec_env(spec: dict) -> dict[str, str]:
    process = spec.get("process") if isinstance(spec, dict) else None
    env = process.get("env") if isinstance(process, dict) else None
    out: dict[str, str] = {}
    for item in env if isinstance(env, list) else ():
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            out[name] = value
    return out


def _mib(name: str, value: str) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) >= 1 << 44:
        raise NvctError(f"apply-cuda-memory-limits: {name}={value!r} is not a whole number of MiB")
    return int(text)


#: The chain step that enforces NVIDIA_REQUIRE_* for specs that native CDI consumers apply.
REQUIREMENTS_STEP = kinds.CheckRequirements.name


def check_requirements(step: kinds.CheckRequirements, ctx: HookContext) -> None:
    """``--driver-version V [--cuda-version C] [--gpu /dev/nvidiaN::ARCH::BRAND]...``: refuse a
    container whose ``NVIDIA_REQUIRE_*`` this node cannot satisfy (nvct.request.requirements).

    The first step of a generated spec's chain, so podman, containerd and docker's
    CDI path enforce what jit-cdi and legacy mode do, in the process that runs
    anyway. The facts are the node's when the spec was generated (the refresh
    unit regenerates it when the driver changes); ``arch`` and ``brand`` are those
    of the ``--gpu`` nodes the container's spec has.
    """
    env = _spec_env(ctx.spec)
    if "CUDA_VERSION" not in env and not any(k.startswith("NVIDIA_REQUIRE_") for k in env):
        return  # nothing asked: not even the parser's import on this start
    from nvct.request import requirements

    if not requirements.collect(env):  # NVIDIA_DISABLE_REQUIRE
        return
    present = _spec_device_paths(ctx.spec)
    devices = [(arch or None, brand or None) for path, arch, brand in step.gpus if path in present]
    facts = requirements.DriverFacts(cuda=step.cuda_version or None,
                                     driver=step.driver_version or None, devices=devices)
    requirements.check(env, facts)


def _spec_device_paths(spec: dict) -> set[str]:
    """The container paths of the spec's device nodes (and of nodes bind-mounted, as rootless podman does)."""
    linux = spec.get("linux") if isinstance(spec, dict) else None
    found = linux.get("devices") if isinstance(linux, dict) else None
    out = {d["path"] for d in found if isinstance(d, dict) and isinstance(d.get("path"), str)} \
        if isinstance(found, list) else set()
    mounts = spec.get("mounts") if isinstance(spec, dict) else None
    for m in mounts if isinstance(mounts, list) else ():
        if isinstance(m, dict) and isinstance(m.get("destination"), str) and m["destination"].startswith("/dev/"):
            out.add(m["destination"])
    return out


_PROFILE_DIR = "/etc/nvidia/nvidia-application-profiles-rc.d"
_PROFILE_FILE = _PROFILE_DIR + "/10-container.conf"


def update_application_profile(step: kinds.UpdateApplicationProfile, ctx: HookContext) -> None:
    """Limit EGL/Vulkan to the container's GPUs: ``EGLVisibleDGPUDevices`` = a mask of its
    ``/dev/nvidiaN`` minors, in a driver application profile (the reference's hook of that name)."""
    import stat

    root = ctx.root
    if not root.exists("/dev"):
        return
    fd = root.open("/dev")
    try:
        mask = 0
        for name in os.listdir(fd):
            if not (name.startswith("nvidia") and name[6:].isdigit() and name[6:].isascii()):
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            minor = os.minor(st.st_rdev)
            if stat.S_ISCHR(st.st_mode) and minor < 64:
                mask |= 1 << minor
    finally:
        os.close(fd)
    if not mask:
        return
    # /etc/nvidia is often a read-only volume (the device plugin's ConfigMap):
    # a start must not fail for a profile (the reference's 1.20.0 did; fixed since).
    existing = next(p for p in (_PROFILE_DIR, "/etc/nvidia", "/etc", "/") if root.exists(p))
    if root.is_read_only(existing):
        sys.stderr.write(f"update-application-profile: {existing} is read-only in the container; "
                         "EGL and Vulkan are not limited to its GPUs\n")
        return
    root.makedirs(_PROFILE_DIR, 0o555)
    profile = ('{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",%s]}],'
               '"rules":[{"pattern":[],"profile":"_container_"}]}' % hex(mask))
    root.write_file(_PROFILE_FILE, profile.encode(), 0o444, replace=True)


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


_RUNNERS: dict[type, Callable] = {
    kinds.CreateSymlinks: create_symlinks,
    kinds.EnableCudaCompat: enable_cuda_compat,
    kinds.UpdateLdcache: update_ldcache,
    kinds.CreateSonameSymlinks: create_soname_symlinks,
    kinds.MaskParams: disable_device_node_modification,
    kinds.Chmod: chmod,
    kinds.UpdateApplicationProfile: update_application_profile,
    kinds.BindMount: bind_mount,
    kinds.ReadonlyRoot: readonly_root,
    kinds.ApplyCudaMemoryLimits: apply_cuda_memory_limits,
    kinds.CheckRequirements: check_requirements,
}

#: Every hook name nvct runs (the reference's, and nvct's own).
STEPS = kinds.NAMES
