"""Sandbox edits: a GPU container with no hook and no ``/proc`` overmount, for user namespaces and sandboxes.

Hooks and the ``/proc/driver/nvidia/params`` overmount fail where the
container runs in a user namespace (Kubernetes ``hostUsers: false``, podman
``--userns``) or inside a sandbox (gVisor, Kata, bubblewrap), whose runtimes
run no host hooks. Without the hook chain nothing makes the SONAME links or
the ld cache, so each driver library is bind-mounted again under its SONAME
and ``.so`` names into the loader's default directories: glibc searches
them when the image's ld.so.cache has no entry for the name, so
``dlopen("libcuda.so.1")`` works in any glibc image, cache or not. The
trade-offs (no params mask, no CUDA compat, no MPS pipe directory) are in
docs/cdi.md, "Sandbox mode".
"""

from __future__ import annotations

import os

from nvct.config.keys import Settings
from nvct.discover.driver import MULTIARCH, VDPAU_DIRS, Driver
from nvct.edits.model import ContainerEdits, Mount

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

#: ``nvct cdi generate --mode`` and the config's ``nvct.sandbox`` name it so.
MODE = "sandbox"
#: The annotation that asks for sandbox edits in jit-cdi (value ``true``).
ANNOTATION = "nvct/sandbox"
#: ``nvct.sandbox``: when jit-cdi gives sandbox edits.
CONFIG_KEY = Settings.sandbox.name
POLICIES = ("annotation", "always", "never")
DEFAULT_POLICY = "annotation"


def loader_dirs(arch: str) -> tuple[str, ...]:
    """Directories glibc searches without an ld cache entry, on Debian-family and RHEL-family images.

    Debian's loader searches ``/lib/<triplet>``, ``/usr/lib/<triplet>``, ``/lib``,
    ``/usr/lib``; RHEL's, Fedora's and SUSE's ``/lib64``, ``/usr/lib64`` (64-bit).
    No directory is in both lists, so the ``/usr`` one of each (``/lib*`` is a
    link to it in merged-/usr images).
    """
    return (f"/usr/lib/{MULTIARCH.get(arch, arch + '-linux-gnu')}", "/usr/lib64")


def library_mounts(driver: Driver, libraries, sets, xorg: Sequence[str] = ()) -> list[Mount]:
    """Bind mounts of each library under the names the hook chain's links would give.

    In the library's own folder: the links ``create-symlinks`` makes (SONAME,
    ``.so``, GLX indirect, gbm backend, the X server's GLX module). In the loader
    directories too, for the node's own architecture: the SONAME and ``.so`` names.
    """
    from nvct.edits.build import _GBM_BACKEND, _GLXSERVER, RO_MOUNT, _library_links

    out: list[Mount] = []
    taken = {lib.path for lib in libraries} | set(xorg)

    def add(host: str, target: str, why: str) -> None:
        if target not in taken:
            taken.add(target)
            out.append(Mount(host, target, "bind", RO_MOUNT, reason=why))

    dirs = loader_dirs(driver.arch)
    for lib in libraries:
        folder, name = os.path.split(lib.path)
        host = driver.host_path(lib.path)
        links = [link for _, link in _library_links(lib, name)]
        for link in [lib.soname, *links]:
            add(host, f"{folder}/{link}", f"sandbox: {name} as {link}")
        if lib.soname == _GBM_BACKEND[0] and not lib.compat32 and "graphics" in sets:
            add(host, f"{folder}/{_GBM_BACKEND[1]}", f"sandbox: {name} as the gbm backend")
        if lib.arch != driver.arch or folder in VDPAU_DIRS:
            continue
        for directory in dirs:
            for link in dict.fromkeys([lib.soname, *links]):
                add(host, f"{directory}/{link}", f"sandbox: {name} as {link} where the loader looks")
    for path in xorg:
        folder, name = os.path.split(path)
        if name.startswith(_GLXSERVER + "."):
            add(driver.host_path(path), f"{folder}/{_GLXSERVER}", "sandbox: the X server's GLX module")
    return out


def hookless(edits: ContainerEdits) -> ContainerEdits:
    """``edits`` without hooks and without writable mounts (only the hook mounts those safely)."""
    from nvct.base.log import logger

    for m in edits.mounts:
        if m.writable:
            logger.warning("sandbox: %s left out (writable; only nvct's hook mounts it safely)", m.container_path)
    edits.hooks = []
    edits.mounts = [m for m in edits.mounts if not m.writable]
    return edits


def wanted(spec, config) -> tuple[bool, str]:
    """Whether jit-cdi gives this container sandbox edits, and why (``nvct.sandbox``, the annotation)."""
    from nvct.base.errors import NvctError

    policy = config.sandbox or DEFAULT_POLICY
    if policy not in POLICIES:
        raise NvctError(f"{CONFIG_KEY}: {policy!r} is not one of {', '.join(POLICIES)}")
    if policy != "annotation":
        return policy == "always", f"{CONFIG_KEY} = {policy!r}"
    annotations = spec.get("annotations") if isinstance(spec, dict) else None
    value = annotations.get(ANNOTATION) if isinstance(annotations, dict) else None
    if value is None:
        return False, ""
    if value not in ("true", "false"):
        raise NvctError(f"annotation {ANNOTATION}: {value!r} is not true or false")
    return value == "true", f"annotation {ANNOTATION}={value}"
