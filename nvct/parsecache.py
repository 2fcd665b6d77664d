"""Parsed files remembered across processes, in root-only directories under /run/nvct.

The shim parses its config (TOML) and, in cdi mode, the CDI specs (YAML) on
every container start; importing and running those parsers costs more than
the rest of the start. An entry holds the raw bytes it was parsed from and is
used only when the file's bytes are exactly those, so no change to a file
(even within one mtime tick, or by a copy keeping the mtime) is ever missed.

Entries are ``marshal`` data: built in, so reading one imports nothing. They
are read and written only by root, from a directory that root owns and nobody
else can enter; elsewhere nothing is cached and the file is parsed each time.

There is one entry per file path. Paths come and go (the k8s DRA driver
writes a CDI spec per claim), and /run is memory, so a directory holding more
than :data:`MAX_ENTRIES` entries loses its oldest half whenever an entry is
written (a cache miss, never on the hit path).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any, Callable

ROOT = "/run/nvct"
MAX_ENTRIES = 256


def parse_cached(raw: bytes, path: str, kind: str, parse: Callable[[bytes], Any]) -> Any:
    """``parse(raw)``, or what it returned for these same bytes of ``path`` before.

    ``kind`` names the cache directory (``ROOT/<kind>-cache``). Errors from
    ``parse`` propagate and are not cached.
    """
    import marshal

    entry = _entry(path, kind)
    if entry:
        try:
            with open(entry, "rb") as f:
                cached_raw, data = marshal.loads(f.read())
            if cached_raw == raw:
                return data
        except (OSError, ValueError, EOFError, TypeError):
            pass
    data = parse(raw)
    if entry:
        tmp = f"{entry}.{os.getpid()}.tmp"
        try:
            blob = marshal.dumps((raw, data))
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as f:
                f.write(blob)
            os.replace(tmp, entry)
            _trim(os.path.dirname(entry), entry)
        except (OSError, ValueError):  # ValueError: a value marshal cannot hold (a TOML date)
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return data


def _entry(path: str, kind: str) -> str | None:
    """The entry for ``path``, only where nobody but root can write it."""
    if os.geteuid() != 0:
        return None
    directory = f"{ROOT}/{kind}-cache"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:
        return None
    if not _root_only_dir(st):
        return None
    name = os.path.abspath(path).replace("%", "%25").replace("/", "%")
    return os.path.join(directory, name[-200:] + ".marshal")


def _trim(directory: str, keep: str) -> None:
    """Keep the newest half of ``directory``'s entries (and ``keep``) once it holds more than MAX_ENTRIES."""
    with os.scandir(directory) as it:
        entries = [e for e in it if e.name.endswith(".marshal") and e.path != keep]
    if len(entries) < MAX_ENTRIES:
        return
    entries.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
    for e in entries[:len(entries) - MAX_ENTRIES // 2]:
        try:
            os.unlink(e.path)
        except OSError:
            pass


def _root_only_dir(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077
