"""Find and exec the low-level OCI runtime (runc, crun) named in the config."""

from __future__ import annotations

import os
import sys

from nvct.errors import ConfigError


def find(names: list[str]) -> str:
    """The first of ``names`` that exists: an absolute path, or a PATH lookup.

    Our own executable is never chosen, so a config that names the shim
    itself cannot make it exec itself forever.
    """
    own = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    for name in names:
        path = name if os.path.isabs(name) else which(name)
        if path and os.path.isfile(path) and os.access(path, os.X_OK) and os.path.realpath(path) != own:
            return path
    raise ConfigError(
        f"nvidia-container-runtime.runtimes: none of {names} found "
        f"(PATH={_search_path()}); install runc or set an absolute path"
    )


def execv(path: str, argv: list[str]) -> None:
    os.execv(path, [path] + list(argv))


def which(name: str) -> str | None:
    """PATH lookup (shutil.which would cost an import of shutil on every container start)."""
    for directory in _search_path().split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _search_path() -> str:
    # containerd's shim may hand us no PATH at all.
    return os.environ.get("PATH") or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
