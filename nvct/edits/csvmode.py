"""Jetson/Tegra's ``csv`` mode: the files the board's CSV lists name, and nothing else.

A Jetson has no NVIDIA kernel module of the desktop kind and no NVML: its
integrated GPU is ``/dev/nvhost-*``, ``/dev/nvmap`` and friends, and L4T lists
what a GPU container needs in CSV files under
``nvidia-container-runtime.modes.csv.mount-spec-path`` (default
``/etc/nvidia-container-runtime/host-files-for-container.d``). Each line is
``TYPE, PATH``: ``dev`` a character device (a glob may name several), ``lib``
a library or other file, ``sym`` a symlink, ``dir`` a directory; other lines
are skipped, as the reference skips them. Only ``devices.csv``,
``drivers.csv`` and ``l4t.csv`` are read unless the image sets
``NVIDIA_REQUIRE_JETPACK=csv-mounts=all``.

Every path is resolved in the driver root (its absolute links are the
board's), never in the host's or the image's: the file at the end of the
chain is bind-mounted read-only at its path, and each link of the chain is
made in the container by nvct's hook chain, which writes only through the
container's verified root (a symlink of the image's on the way is refused or
stays inside the root). Device nodes come from the dev root. The libraries'
SONAME links and ld cache entries follow, as for every other mode.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import ConfigError
from nvct.config.keys import Settings
from nvct.edits import steps as kinds
from nvct.edits.model import Chain, ContainerEdits, DeviceNode, Mount

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvct.discover.driver import Driver

MOUNT_SPEC_PATH_KEY = Settings.csv_mount_spec_path.name
DEFAULT_MOUNT_SPEC_PATH = Settings.csv_mount_spec_path.default
#: The files read unless the image asks for all of them (the reference's rule).
BASE_FILES = ("devices.csv", "drivers.csv", "l4t.csv")
JETPACK_ENV = "NVIDIA_REQUIRE_JETPACK"
ALL_MOUNTS = "csv-mounts=all"
TYPES = ("dev", "lib", "sym", "dir")
#: Files that say what board this is, mounted where they exist (as the reference).
SYSTEM_FILES = ("/etc/nv_tegra_release", "/sys/devices/soc0/family")
_RO = ("ro", "nosuid", "nodev", "rbind", "rprivate")
_MAX_HOPS = 40


def mount_spec_path(config) -> str:
    return config.csv_mount_spec_path or DEFAULT_MOUNT_SPEC_PATH


def csv_files(directory: str, *, all_files: bool = False) -> list[str]:
    """The directory's ``*.csv`` files in name order (not recursive; absent: none)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ConfigError(f"{MOUNT_SPEC_PATH_KEY}: {directory}: {e.strerror}") from None
    out = []
    for name in names:
        if name == ".csv" or not name.lower().endswith(".csv") or (not all_files and name not in BASE_FILES):
            continue
        if os.path.isfile(os.path.join(directory, name)):
            out.append(os.path.join(directory, name))
    return out


def parse(path: str) -> list[tuple[str, str]]:
    """(type, path) of each valid line of one CSV file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    out = []
    for line in lines:
        kind, sep, target = line.strip().partition(",")
        kind, target = kind.strip(), target.strip()
        if sep and kind in TYPES and target:
            out.append((kind, target))
    return out


def entries(files) -> dict[str, list[str]]:
    """Every file's entries by type, in order, without repeats."""
    by_type: dict[str, list[str]] = {t: [] for t in TYPES}
    for path in files:
        for kind, target in parse(path):
            if target not in by_type[kind]:
                by_type[kind].append(target)
    return by_type


def files_for(request, config) -> list[str]:
    """The CSV files a request reads (``NVIDIA_REQUIRE_JETPACK=csv-mounts=all``: every one)."""
    everything = dict(request.env).get(JETPACK_ENV) == ALL_MOUNTS if request is not None else True
    return csv_files(mount_spec_path(config), all_files=everything)


def chain(root: str, path: str) -> tuple[list[tuple[str, str]], str] | None:
    """The symlinks met resolving ``path`` in ``root`` ((link, its target as written)) and the real path.

    Links are followed as if ``root`` were ``/``: an absolute target is the
    board's path, ``..`` never leaves the root. None when nothing is there.
    """
    from nvct.discover.rootpath import join_root as _join, walk_in_root as _walk_in_root

    links: list[tuple[str, str]] = []
    real = _walk_in_root(root, path, _MAX_HOPS, links)
    return (links, real) if real is not None and os.path.lexists(_join(root, real)) else None


def container_edits(driver: Driver, files, *, hook_path: str, ldconfig: str | None = None) -> ContainerEdits:
    """The edits the CSV ``files`` give on this board: device nodes, mounts, one hook chain."""
    from nvct.base.log import logger
    from nvct.edits import build as injection
    from nvct.linux import elf

    by_type = entries(files)
    edits = ContainerEdits()
    for pattern in by_type["dev"]:
        nodes = _devices(driver, pattern)
        if not nodes:
            logger.warning("csv: dev %s: no character device under %s", pattern, driver.dev_root)
        for node in nodes:
            if node not in edits.device_nodes:
                edits.device_nodes.append(node)
    links: list[str] = []
    folders: list[str] = []
    libraries: list[str] = []
    mounted: set[str] = set()
    for kind in ("dir", "lib", "sym"):
        for path in by_type[kind]:
            found = resolve(driver, kind, path)
            if isinstance(found, str):
                logger.warning("csv: %s %s: %s", kind, path, found)
                continue
            chained, real = found
            host = driver.host_path(real)
            for link, target in chained:
                if f"{target}::{link}" not in links:
                    links.append(f"{target}::{link}")
            if real in mounted:
                continue
            mounted.add(real)
            edits.mounts.append(Mount(host, real, "bind", _RO, reason=f"csv {kind} {path}"))
            if kind != "dir" and ".so" in os.path.basename(real):
                soname = elf.soname(host)
                if soname is None:  # not a 64-bit library: ldconfig would not enter it
                    continue
                folder = os.path.dirname(real)
                if folder not in folders:
                    folders.append(folder)
                if soname != os.path.basename(real):
                    links.append(f"{os.path.basename(real)}::{folder}/{soname}")
                libraries.append(f"{folder}/{soname}")
    for path in SYSTEM_FILES:
        host = driver.host_path(path)
        # Under /sys the target is the kernel's: the container's sysfs must have it (a real board's does).
        if os.path.isfile(host) and not os.path.islink(host) and (not path.startswith("/sys/") or
                                                                  os.path.isfile(path)):
            edits.mounts.append(Mount(host, path, "bind", _RO, reason="Tegra system file"))
    steps: list[kinds.Step] = []
    links = list(dict.fromkeys(links))
    if links:
        steps.append(kinds.CreateSymlinks(tuple(tuple(link.split("::", 1)) for link in links)))
    if folders:
        steps.append(kinds.UpdateLdcache(tuple(folders), tuple(dict.fromkeys(libraries)), ldconfig or ""))
    if steps:
        edits.hooks.append(Chain("createContainer", hook_path, tuple(injection.chain_prefix(hook_path)), tuple(steps),
                                 reason="csv: the listed symlinks, SONAME links and ld cache in the container"))
    return edits


def resolve(driver: Driver, kind: str, path: str) -> tuple[list[tuple[str, str]], str] | str:
    """A ``dir``, ``lib`` or ``sym`` entry's :func:`chain` in the driver root, or why it gives nothing."""
    found = chain(driver.driver_root, path)
    if found is None:
        return f"not found in the driver root {driver.driver_root}"
    real = found[1]
    host = driver.host_path(real)
    if not (os.path.isdir(host) if kind == "dir" else os.path.isfile(host)):
        return f"{real} is not a {'directory' if kind == 'dir' else 'file'}"
    return found


def unresolved(driver: Driver, files) -> list[tuple[str, str, str]]:
    """(type, path, why) of each entry of the CSV ``files`` that gives a container nothing (for the doctor)."""
    by_type = entries(files)
    out = [("dev", p, f"no character device under {driver.dev_root}") for p in by_type["dev"]
           if not _devices(driver, p)]
    for kind in ("dir", "lib", "sym"):
        out += [(kind, p, why) for p in by_type[kind] if isinstance(why := resolve(driver, kind, p), str)]
    return out


def _devices(driver: Driver, pattern: str) -> list[DeviceNode]:
    """The character devices a ``dev`` entry names (a glob may name several), from the dev root."""
    import fnmatch

    path = pattern if pattern.startswith("/") else "/dev/" + pattern
    directory, name = os.path.split(path)
    host_dir = driver.dev_host_path(directory)
    try:
        names = sorted(n for n in os.listdir(host_dir) if fnmatch.fnmatchcase(n, name))
    except OSError:
        return []
    out = []
    for n in names:
        host = os.path.join(host_dir, n)
        try:
            st = os.stat(host)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            out.append(DeviceNode(f"{directory}/{n}", os.major(st.st_rdev), os.minor(st.st_rdev), host_path=host,
                                  file_mode=stat.S_IMODE(st.st_mode), reason=f"csv dev {pattern}"))
    return out


def is_tegra(driver: Driver) -> bool:
    """A Jetson whose GPU is the integrated one: a Tegra board (``/etc/nv_tegra_release``, or soc0's
    family says tegra) with no NVIDIA kernel module of the desktop kind (a board with a discrete GPU
    and its module is an ordinary node, as the reference decides with NVML)."""
    if os.path.exists(os.path.join(driver.proc_root, "driver/nvidia/version")):
        return False
    if os.path.isfile(driver.host_path("/etc/nv_tegra_release")):
        return True
    try:
        with open(driver.host_path("/sys/devices/soc0/family"), encoding="utf-8", errors="replace") as f:
            return f.read().strip().lower() == "tegra"
    except OSError:
        return False
