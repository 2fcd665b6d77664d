"""Where the driver's utilities (nvidia-smi, the MPS and IMEX daemons ...) are found.

As NVIDIA's lookup does: in the caller's PATH first, then the standard folders,
executable files only. A node that keeps the driver in its own folder
(``/usr/local/nvidia/bin``) names it in the engine's PATH, and may have a
wrapper script of the same name in /usr/bin. Light on imports: the legacy
hook's entry (nvct.modifier.modes) asks it on the shim's path.
"""

from __future__ import annotations

import os

from nvct.discover.catalog import BIN_DIRS, BINARIES
from nvct.discover.rootpath import join_root


def search_dirs() -> list[str]:
    """PATH's absolute folders, then the standard ones it lacks."""
    dirs = [os.path.normpath(d) for d in os.environ.get("PATH", "").split(":") if d.startswith("/")]
    return list(dict.fromkeys([*dirs, *BIN_DIRS]))


def find(driver_root: str, name: str, dirs) -> str | None:
    """``name``'s path (inside the driver root) in the first of ``dirs`` that holds it executable."""
    return next((f"{d}/{name}" for d in dirs if _is_executable(join_root(driver_root, f"{d}/{name}"))), None)


def folders_on_path(driver_root: str) -> list[str]:
    """The caller's PATH folders beyond the standard ones that hold a driver utility: the legacy
    hook, whose PATH nvct seals, gets them first."""
    names = [name for names in BINARIES.values() for name in names]
    return [d for d in search_dirs() if d not in BIN_DIRS and any(find(driver_root, n, (d,)) for n in names)]


def _is_executable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_mode & 0o170000 == 0o100000 and bool(st.st_mode & 0o111)
