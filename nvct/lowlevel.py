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


#: config path -> low-level runtime, one "path<TAB>runtime" line each: what the shell front
#: (nvct/scripts/nvidia-container-runtime) execs for every call but create and run.
CACHE_DIR = "/run/nvct"
CACHE = CACHE_DIR + "/runtimes"
_CACHE_MAX = 64


def remember(config_path: str, runtime: str) -> None:
    """Record ``runtime`` for ``config_path`` (root only; nothing else may write there)."""
    if os.geteuid() != 0 or "\t" in config_path or "\n" in config_path:
        return
    entries: dict[str, str] = {}
    try:
        with open(CACHE, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("\t")
                if sep:
                    entries[key] = value
    except (OSError, UnicodeDecodeError):
        pass
    if entries.get(config_path) == runtime:
        return
    if len(entries) >= _CACHE_MAX:  # many config files are a test machine's; keep it small
        entries.clear()
    entries[config_path] = runtime
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        st = os.stat(CACHE_DIR)
        if st.st_uid != 0 or st.st_mode & 0o022:
            return
        tmp = f"{CACHE}.{os.getpid()}.tmp"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.writelines(f"{k}\t{v}\n" for k, v in sorted(entries.items()))
        os.replace(tmp, CACHE)
    except OSError:
        pass


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
