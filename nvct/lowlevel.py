"""Find and exec the low-level OCI runtime (runc, crun) named in the config."""

from __future__ import annotations

import os
import sys
import time

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


#: config path -> low-level runtime: what the shell front (nvct/scripts/nvidia-container-runtime)
#: execs for every call but create and run. One "config<TAB>runtime<TAB>stamp" line each; the
#: stamp is an empty root-only file whose mtime is the config file's when it was read ("-": there
#: was no config file; "!": not to be trusted, see :func:`remember`). The shell front uses a line
#: only while the config's mtime equals the stamp's (two ``test -nt``, no fork), so an edited
#: config never runs a runtime it no longer names: the next call goes through Python. In legacy
#: mode the line goes on with "<TAB>file": a root-only file in :data:`HOOKS` whose two lines are a
#: program and the prestart hook that program's front appends to a GPU container's config.json
#: itself (:func:`nvct.modes.legacy_record`). It is a file of its own because the front's ``read``
#: takes a byte per system call: every line before the one it looks for costs its length.
CACHE_DIR = "/run/nvct"
CACHE = CACHE_DIR + "/runtimes"
STAMPS = CACHE_DIR + "/stamps"
HOOKS = CACHE_DIR + "/legacy-hooks"
_CACHE_MAX = 64
_ABSENT, _UNTRUSTED = "-", "!"
#: A config younger than this may still change within the filesystem's timestamp granularity
#: without its mtime changing ("racy git"): its line is written untrusted.
_RACY_NS = 2_000_000_000


def stamp(config_path: str) -> int | None | bool:
    """The config file's mtime, taken *before* reading it; ``False`` when it cannot be known."""
    try:
        return os.stat(config_path).st_mtime_ns
    except FileNotFoundError:
        return None
    except OSError:
        return False


def remember(config_path: str, runtime: str, seen: int | None | bool,
             legacy: tuple[str, str] | None = None) -> None:
    """Record ``runtime`` for ``config_path`` read at mtime ``seen`` (root only; nothing else may
    write there), and ``legacy``'s (program, hook) when there is one. A directory that is not
    root's or that others may write is not used, and a cache found in one is removed."""
    if os.geteuid() != 0 or "\t" in config_path or "\n" in config_path:
        return
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        if not _private(CACHE_DIR):
            _unlink(CACHE)
            return
        entries = _entries()
        mark = _mark(config_path, seen)
        hooks = _hook_file(config_path, legacy)
        entry = (runtime, mark, hooks)
        if entries.get(config_path) == entry and _stamp_holds(mark, seen) and _hook_file_holds(hooks, legacy):
            return
        if len(entries) >= _CACHE_MAX:  # many config files are a test machine's; keep it small
            entries.clear()
        entries[config_path] = entry
        if mark.startswith("/"):
            _write_private(mark, "", mtime_ns=seen)  # type: ignore[arg-type]
        if hooks:
            _write_private(hooks, "".join(f"{line}\n" for line in legacy or ()))
        _write_private(CACHE, "".join("\t".join((k, *(e if e[2] else e[:2]))) + "\n"
                                      for k, e in sorted(entries.items())))
        _prune(STAMPS, {e[1] for e in entries.values()})
        _prune(HOOKS, {e[2] for e in entries.values()})
    except OSError:
        pass


def last_known(config_path: str) -> str | None:
    """The runtime last recorded for ``config_path``, whatever its stamp: what the containers
    created under that config run with, and so what a broken config falls back to."""
    if not _private(CACHE_DIR):
        return None
    runtime = _entries().get(config_path, (None, ""))[0]
    return runtime if runtime and os.access(runtime, os.X_OK) else None


def _entries() -> dict[str, tuple[str, str, str]]:
    entries: dict[str, tuple[str, str, str]] = {}
    try:
        with open(CACHE, encoding="utf-8") as f:
            for line in f:
                key, runtime, mark, hooks = (line.rstrip("\n").split("\t", 3) + [""] * 3)[:4]
                if runtime:
                    entries[key] = (runtime, mark or _UNTRUSTED, hooks)
    except (OSError, UnicodeDecodeError):
        pass
    return entries


def _mark(config_path: str, seen: int | None | bool) -> str:
    if seen is None:
        return _ABSENT
    if seen is False or time.time_ns() - seen < _RACY_NS:  # type: ignore[operator]
        return _UNTRUSTED
    return f"{STAMPS}/{_crc(config_path)}"


def _crc(text: str) -> str:
    import zlib  # only when a line is written

    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


def _hook_file(config_path: str, legacy: tuple[str, str] | None) -> str:
    """Named by the config and the content, so a line names exactly what its own run wrote."""
    if not legacy or any(c in "\n\t" for c in "".join(legacy)):
        return ""
    return f"{HOOKS}/{_crc(config_path)}-{_crc(chr(10).join(legacy))}"


def _hook_file_holds(path: str, legacy: tuple[str, str] | None) -> bool:
    if not path:
        return True
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            return f.read() == "".join(f"{line}\n" for line in legacy or ())
    except (OSError, UnicodeDecodeError):
        return False


def _write_private(path: str, text: str, mtime_ns: int | None = None) -> None:
    """``text`` into ``path`` (0600, its directory made 0700; a stamp: ``mtime_ns``), renamed into place."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w",
              encoding="utf-8") as f:
        f.write(text)
    if mtime_ns is not None:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def _stamp_holds(mark: str, seen: int | None | bool) -> bool:
    if not mark.startswith("/"):
        return True
    try:
        return os.stat(mark, follow_symlinks=False).st_mtime_ns == seen
    except OSError:
        return False


def _prune(directory: str, keep: set[str]) -> None:
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        path = f"{directory}/{name}"
        if path not in keep and not name.endswith(".tmp"):
            _unlink(path)


def _private(path: str) -> bool:
    """Root's, not a symlink, and writable by no one else: the shell front's checks, and more."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022 and os.path.isdir(path) and not os.path.islink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def execv(path: str, argv: list[str]) -> None:
    """Exec the low-level runtime with the environment the engine gave the shim, whole."""
    from nvct import hookenv

    os.execve(path, [path] + list(argv), hookenv.caller_environ())


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
