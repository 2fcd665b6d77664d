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
#: Why an entry could not be used or written in this process (a full /run, a directory that is not
#: root's): the shim logs them as a debug line, since every start then pays the parse.
problems: list[str] = []


def parse_cached(raw: bytes, path: str, kind: str, parse: Callable[[bytes], Any]) -> Any:
    """``parse(raw)``, or what it returned for these same bytes of ``path`` before.

    ``kind`` names the cache directory (``ROOT/<kind>-cache``). Errors from
    ``parse`` propagate and are not cached.
    """
    import marshal

    directory = _directory(kind)
    if directory is None:
        return parse(raw)
    try:
        name = _name(path)
        blob = read_at(directory, name)
        if blob is not None:
            try:
                cached_raw, data = marshal.loads(blob)
                if cached_raw == raw:
                    return data
            except (ValueError, EOFError, TypeError):
                pass
        data = parse(raw)
        try:
            from nvct.base import fileutil

            fileutil.replace_at(directory, name, marshal.dumps((raw, data)), 0o600)
            _trim(directory, name)
        except ValueError:  # a value marshal cannot hold (a TOML date)
            pass
        except OSError as e:
            problems.append(f"{ROOT}/{kind}-cache/{name}: not written: {e.strerror or e}")
        return data
    finally:
        os.close(directory)


def digest(raw: bytes) -> str:
    """A file's content identity, as the legacy hook's env carries its config's (:func:`keep`)."""
    try:
        from _blake2 import blake2b  # built in: hashlib would cost ~7 ms of imports here
    except ImportError:  # pragma: no cover - an interpreter without it
        from hashlib import blake2b
    return blake2b(raw, digest_size=16).hexdigest()


def keep(raw: bytes) -> str | None:
    """Keep ``raw`` (a config the shim decided with) under its :func:`digest` in ``ROOT/config-kept``.

    The legacy hook runs after the shim, and the config may be rewritten in
    between: the hook reads the kept copy (:func:`kept`), never the file
    again. Returns the digest, or None where nothing can be kept.
    """
    name = digest(raw)
    directory = _directory("config", "-kept")
    if directory is None:
        return None
    try:
        if read_at(directory, name) != raw:
            from nvct.base import fileutil

            fileutil.replace_at(directory, name, raw, 0o600)
            _trim(directory, name, suffix="")
        return name
    except OSError as e:
        problems.append(f"{ROOT}/config-kept/{name}: not written: {e.strerror or e}")
        return None
    finally:
        os.close(directory)


def kept(name: str) -> bytes | None:
    """The config bytes :func:`keep` kept under ``name``, if they are still there (and are those)."""
    if not name or not name.isascii() or not name.isalnum():
        return None
    directory = _directory("config", "-kept", create=False)
    if directory is None:
        return None
    try:
        raw = read_at(directory, name)
    finally:
        os.close(directory)
    return raw if raw is not None and digest(raw) == name else None


def _directory(kind: str, suffix: str = "-cache", *, create: bool = True) -> int | None:
    """``ROOT/<kind><suffix>`` opened through no symlink, only where nobody but root can write it."""
    if os.geteuid() != 0:
        return None
    from nvct.base import fileutil

    try:
        top = fileutil.open_dir(ROOT, create_mode=0o700)
    except OSError as e:
        problems.append(f"{ROOT}: not used: {e.strerror}")
        return None
    try:
        if not fileutil.private(os.fstat(top)):
            problems.append(f"{ROOT}: not used: not root's, or others may write it")
            return None
        fd = fileutil.open_private_dir(top, f"{kind}{suffix}", create=create)
        if fd is None and create:
            problems.append(f"{ROOT}/{kind}{suffix}: not used: not root's, or others may write it")
        return fd
    finally:
        os.close(top)


def _name(path: str) -> str:
    name = os.path.abspath(path).replace("%", "%25").replace("/", "%")
    return name[-200:] + ".marshal"


def read_at(dir_fd: int, name: str) -> bytes | None:
    """The file ``name`` in ``dir_fd``, never through a link; None where it cannot be read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _trim(dir_fd: int, keep: str, suffix: str = ".marshal") -> None:
    """Keep the newest half of the directory's entries (and ``keep``) once it holds more than MAX_ENTRIES."""
    from nvct.base.fileutil import temp_pid

    entries = []
    for name in os.listdir(dir_fd):
        if name.endswith(suffix) and name != keep and temp_pid(name) is None:
            try:
                entries.append((os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns, name))
            except OSError:
                pass
    if len(entries) < MAX_ENTRIES:
        return
    entries.sort()
    for _, name in entries[:len(entries) - MAX_ENTRIES // 2]:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
