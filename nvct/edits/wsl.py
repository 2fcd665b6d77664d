"""WSL2 nodes: the GPU is ``/dev/dxg``, the driver is Windows' driver store.

On WSL2 there is no NVIDIA kernel module, no ``/proc/driver/nvidia`` and no
``/dev/nvidia*``: the Linux side reaches the Windows driver through the
``dxg`` device (the dxgkrnl misc device), and the user-space driver lies in
the driver store Windows shares at ``/usr/lib/wsl/drivers/<store>/``, with
WSL's own ``/usr/lib/wsl/lib``. As the reference's ``wsl`` CDI mode, a
container gets ``/dev/dxg`` (one device, ``all``), each of the driver-store
files NVIDIA lists, found first in the driver store and else in
``/usr/lib/wsl/lib``, mounted read-only at the path it has on the node, a
``/usr/bin/nvidia-smi`` link to the driver store's, and the ld cache entries
of those folders.

The reference asks dxcore (``libdxcore.so``, a Windows call) for the NVIDIA
adapter's driver store; nvct cannot call Windows, so it takes the driver
store folders that hold NVIDIA's ``libcuda.so.1.1``.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import DriverError, RequestError
from nvct.edits import steps as kinds
from nvct.edits.model import Chain, ContainerEdits, DeviceNode, Mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvct.discover.driver import Driver

DXG = "/dev/dxg"
DRIVERS_DIR = "/usr/lib/wsl/drivers"
WSL_LIB = "/usr/lib/wsl/lib"
NVIDIA_SMI_LINK = "/usr/bin/nvidia-smi"
#: The driver store's files a container gets, as the reference lists them (its pkg/nvcdi/driver-wsl.go).
DRIVER_STORE_FILES = (
    "libcuda.so.1.1", "libcuda_loader.so", "libnvidia-ptxjitcompiler.so.1", "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so", "libdxcore.so", "libnvdxgdmal.so.1", "nvcubins.bin", "nvidia-smi",
)
#: What marks a driver store folder as NVIDIA's.
_NVIDIA_MARK = "libcuda.so.1.1"
_RO = ("ro", "nosuid", "nodev", "rbind", "rprivate")


def is_wsl(driver: Driver) -> bool:
    """A WSL2 node: ``/dev/dxg`` under the dev root is a character device."""
    try:
        return stat.S_ISCHR(os.stat(driver.dev_host_path(DXG)).st_mode)
    except OSError:
        return False


def dxg_node(driver: Driver) -> DeviceNode:
    host = driver.dev_host_path(DXG)
    try:
        st = os.stat(host)
    except OSError as e:
        raise DriverError(f"WSL2: {host}: {e.strerror}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise DriverError(f"WSL2: {host} is not a character device")
    return DeviceNode(DXG, os.major(st.st_rdev), os.minor(st.st_rdev), host_path=host,
                      file_mode=stat.S_IMODE(st.st_mode), reason="WSL2: the dxg device (every GPU)")


def driver_stores(driver: Driver) -> list[str]:
    """The NVIDIA driver store folders (node paths), in name order."""
    from nvct.discover.driver import resolve_in_root

    top = driver.host_path(DRIVERS_DIR)
    try:
        names = sorted(os.listdir(top))
    except OSError:
        return []
    out = []
    for name in names:
        folder = f"{DRIVERS_DIR}/{name}"
        found = resolve_in_root(driver.driver_root, f"{folder}/{_NVIDIA_MARK}")
        if found and os.path.isdir(driver.host_path(folder)) and not os.path.islink(driver.host_path(folder)):
            out.append(folder)
    return out


def files(driver: Driver) -> list[tuple[str, str]]:
    """(node path, path to mount from, resolved in the driver root) of each driver-store file found."""
    from nvct.discover.driver import resolve_in_root

    stores = driver_stores(driver)
    if not stores:
        raise DriverError(f"WSL2: no NVIDIA driver store (a folder holding {_NVIDIA_MARK}) under "
                          f"{driver.host_path(DRIVERS_DIR)}")
    if len(stores) > 1:
        from nvct.base.log import logger

        logger.warning("WSL2: several NVIDIA driver stores (%s); each file is taken from the first that has it",
                       ", ".join(stores))
    out = []
    for name in DRIVER_STORE_FILES:
        for folder in (*stores, WSL_LIB):
            path = f"{folder}/{name}"
            real = resolve_in_root(driver.driver_root, path)
            if real and os.path.isfile(driver.host_path(real)):
                out.append((path, real))
                break
    return out


def common_edits(driver: Driver, *, hook_path: str, ldconfig: str | None = None) -> ContainerEdits:
    """What every container on a WSL2 node gets besides ``/dev/dxg``: the driver store's files,
    the nvidia-smi link and the ld cache entries (one createContainer hook chain)."""
    from nvct.edits import build as injection
    from nvct.linux import elf

    edits = ContainerEdits()
    links: list[str] = []
    folders: list[str] = []
    entries: list[str] = []
    for path, real in files(driver):
        edits.mounts.append(Mount(driver.host_path(real), path, "bind", _RO, reason="WSL2 driver store file"))
        folder, name = os.path.split(path)
        if name == "nvidia-smi":
            links.append(f"{path}::{NVIDIA_SMI_LINK}")
            continue
        if ".so" not in name:
            continue
        if folder not in folders:
            folders.append(folder)
        soname = elf.soname(driver.host_path(real))
        if soname is None:  # not a 64-bit library: ldconfig skips it too
            continue
        if soname != name:
            links.append(f"{name}::{folder}/{soname}")
        entries.append(f"{folder}/{soname}")
    steps: list[kinds.Step] = []
    if links:
        steps.append(kinds.CreateSymlinks(tuple(tuple(link.split("::", 1)) for link in links)))
    if folders:
        steps.append(kinds.UpdateLdcache(tuple(folders), tuple(entries), ldconfig or ""))
    if steps:
        edits.hooks.append(Chain("createContainer", hook_path, tuple(injection.chain_prefix(hook_path)), tuple(steps),
                                 reason="WSL2: nvidia-smi link and ld cache inside the container"))
    return edits


def check_ids(device_ids, what: str) -> None:
    """WSL2 has one device, ``all`` (every GPU is behind /dev/dxg), as the reference."""
    for d in device_ids:
        if d != "all":
            raise RequestError(f"{what} {d!r}: a WSL2 node has one device, all (every GPU is behind {DXG})")


def container_edits(request, driver: Driver, *, hook_path: str, ldconfig: str | None = None) -> ContainerEdits:
    """A GPU request's edits on a WSL2 node (jit-cdi and legacy): every GPU, whatever it names."""
    ids = [d for d in (request.devices or ()) if d not in ("all", "none", "void")]
    if ids:
        from nvct.base.log import logger

        logger.debug("WSL2: %s name GPUs (%s); a WSL2 container gets every GPU through %s",
                       "NVIDIA_VISIBLE_DEVICES", ", ".join(ids), DXG)
    edits = ContainerEdits(device_nodes=[dxg_node(driver)])
    edits.extend(common_edits(driver, hook_path=hook_path, ldconfig=ldconfig))
    return edits
