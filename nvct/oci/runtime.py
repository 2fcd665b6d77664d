"""Find and exec the low-level OCI runtime (runc, crun) named in the config."""

from __future__ import annotations

import os
import sys
import time

from nvct.base.errors import ConfigError


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


#: config path -> what the sh front (nvct/scripts/launcher, as ``nvidia-container-runtime`` and
#: ``nvidia-container-runtime-hook``) may do without Python under that config: one
#: "config<TAB>runtime<TAB>identity<TAB>hooks<TAB>names" line each ("-" for a field with nothing in
#: it). Python's own store: the front reads :data:`FRONTS`, rendered from it.
#:
#: * runtime: the low-level runtime the shim execs for every call but a GPU create ("-": recorded
#:   by the hook, which resolves none);
#: * identity: the config file as ``stat -L -c`` :data:`IDENTITY_FORMAT` prints it (device, inode,
#:   size, mtime, ctime), taken before it was read; "-": there was no config file; "!": not to be
#:   trusted (:func:`identity`). A front uses a line only while ``stat`` prints exactly this, so
#:   any change to the file (a copy keeping its mtime too: the ctime moves) goes through Python;
#: * hooks: in legacy mode, a root-only file in :data:`HOOKS` naming a program and the complete
#:   prestart hooks that program's front appends to a GPU container's config.json itself
#:   (:func:`nvct.modifier.modes.legacy_record`), as sh assignments the front sources;
#: * names: a root-only file in :data:`NAMES`, one string a line, that the fronts hand to
#:   ``grep -F -f``: the strings without which a config.json cannot ask for a GPU under this
#:   config (:func:`nvct.request.container.request_markers`). The fronts never work them out themselves.
#:
#: Every file is named by its content's hash and written once, so concurrent writers agree. All of
#: it is opened from a /run/nvct that is root's and writable by no one else, through no symlink in
#: any component (:mod:`nvct.base.fileutil`).
CACHE_DIR = "/run/nvct"
CACHE = CACHE_DIR + "/runtimes"
HOOKS = CACHE_DIR + "/legacy-hooks"
NAMES = CACHE_DIR + "/names"
#: :data:`CACHE` as the fronts read it: sh that they source (``command .``), which defines
#: ``nvct_args`` (runc's command line as nvct.oci.runcargs reads it), sets ``$config`` (the config
#: file's path as nvct.config.file.default_path finds it) and, for that config, ``nvct_runtime``,
#: ``nvct_hooks``, ``nvct_names`` (full paths) and what the config must be for them to hold:
#: ``nvct_ident`` (``stat -L -c "$nvct_stat"`` prints it) or ``nvct_absent`` (no file). Written
#: from :data:`CACHE` whenever that changes, so the record's format, and what each field means,
#: has one home here; the fronts parse nothing.
FRONTS = CACHE_DIR + "/fronts"
IDENTITY_FORMAT = "%d:%i:%s:%.9Y:%.9Z"
_CACHE_MAX = 64
_NONE, _ABSENT, _UNTRUSTED = "-", "-", "!"
#: A config changed this recently may change again within one tick of the clock that stamps
#: files, keeping its whole identity ("racy git"): it is recorded untrusted. Whole-second
#: timestamps (a file system without nanoseconds) need 2 s.
_RACY_NS, _RACY_COARSE_NS = 10_000_000, 2_000_000_000
#: A names or hooks file younger than this is kept by a prune: another writer may be about to
#: name it in its line.
_YOUNG_NS = 10_000_000_000


def identity(config_path: str) -> str | None | bool:
    """The config file's identity, taken *before* reading it (see :data:`CACHE`); ``None``: no
    file; ``False``: it cannot be known, or it is too fresh to be trusted."""
    try:
        st = os.stat(config_path)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    coarse = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
    if st.st_mtime_ns < 0 or time.time_ns() - st.st_ctime_ns < (_RACY_COARSE_NS if coarse else _RACY_NS):
        return False
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{_seconds(st.st_mtime_ns)}:{_seconds(st.st_ctime_ns)}"


def _seconds(ns: int) -> str:
    """``stat``'s ``%.9Y``."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def remember(config_path: str, seen: str | None | bool, names: list[str], runtime: str | None = None,
             legacy: tuple[str, dict[str, str]] | None = None) -> str | None:
    """Record, for ``config_path`` read with identity ``seen``, the request ``names``, ``runtime``
    and ``legacy``'s (program, record) when there is one (root only: nothing else may write there);
    the record's keys name the front's variables (``nvct_<key>``).

    ``runtime=None`` (the hook): the line keeps the shim's runtime and hook while the config is the
    one they were recorded for. Returns why nothing could be recorded, for a debug line, or None.
    A /run/nvct that is not root's directory, or that others may write, is not used (a cache found
    in such a directory is removed from it, never through a link).
    """
    if os.geteuid() != 0 or any(c in f"{config_path}{runtime}" for c in "\t\n"):
        return None
    from nvct.base import fileutil

    try:
        top = fileutil.open_dir(CACHE_DIR, create_mode=0o700)
    except OSError as e:
        return f"{CACHE_DIR}: not used: {e.strerror}"
    try:
        if not fileutil.private(os.fstat(top)):
            _unlink_at(top, "runtimes")
            _unlink_at(top, "fronts")
            return f"{CACHE_DIR}: not used: not root's, or others may write it"
        return _remember(top, config_path, seen, names, runtime, legacy)
    except OSError as e:
        return f"{CACHE_DIR}: not written: {e.strerror or e}"
    finally:
        os.close(top)


def _remember(top: int, config_path: str, seen, names: list[str], runtime: str | None,
              legacy: tuple[str, dict[str, str]] | None, *, locked: bool = False) -> str | None:
    from nvct.base import fileutil

    entries = _entries(top)
    mark = _mark(seen)
    names_text = _names_text(names)
    hooks_text: str | None = _hooks_text(legacy)
    old = entries.get(config_path)
    if runtime is None:
        keep = old is not None and old[1] == mark and mark != _UNTRUSTED
        line_runtime, hooks = (old[0], old[2]) if old is not None and keep else (_NONE, _NONE)
        hooks_text = None
    else:
        line_runtime, hooks = runtime, (_content_name(hooks_text) if hooks_text else _NONE)
    entry = (line_runtime, mark, hooks, _content_name(names_text))
    rendered = _read_at(top, "fronts") == _fronts_text(entries)  # an older nvct's may differ, or be none
    if not locked and (old != entry or not rendered or not _holds(top, entry, names_text, hooks_text)):
        # Writers take turns (flock on /run/nvct, released when the process ends, killed too): a
        # line written between another writer's read and write would be lost, a file another
        # writer is about to name pruned. Readers (the fronts) never wait: every file is renamed
        # into place whole.
        import fcntl

        fcntl.flock(top, fcntl.LOCK_EX)
        try:
            return _remember(top, config_path, seen, names, runtime, legacy, locked=True)
        finally:
            fcntl.flock(top, fcntl.LOCK_UN)
    dirs = {}
    try:
        for sub, text, name in ((NAMES, names_text, entry[3]), (HOOKS, hooks_text, entry[2])):
            if not text:
                continue
            fd = dirs[sub] = fileutil.open_private_dir(top, os.path.basename(sub))
            if fd is None:
                return f"{sub}: not used: not root's, or others may write it"
            if _read_at(fd, name) != text:
                fileutil.replace_at(fd, name, text.encode("utf-8", "surrogateescape"), 0o600)
        if old == entry and rendered:
            return None
        # The latest first (the fronts read up to their line a byte per system call); many config
        # files are a test machine's: the oldest go.
        entries.pop(config_path, None)
        lines = [(config_path, entry), *list(entries.items())[:_CACHE_MAX - 1]]
        entries = dict(lines)
        fileutil.replace_at(top, "runtimes", "".join(
            "\t".join((k, *e)) + "\n" for k, e in lines).encode("utf-8", "surrogateescape"))
        fileutil.replace_at(top, "fronts", _fronts_text(entries).encode("utf-8", "surrogateescape"))
        _remove_stamps(top)
        for sub, column in ((NAMES, 3), (HOOKS, 2)):
            if dirs.get(sub) is None:
                dirs[sub] = fileutil.open_private_dir(top, os.path.basename(sub), create=False)
            fd = dirs[sub]
            if fd is not None:
                _prune(fd, {e[column] for e in entries.values()})
    finally:
        for fd in dirs.values():
            if fd is not None:
                os.close(fd)
    return None


def _holds(top: int, entry: tuple[str, str, str, str], names_text: str, hooks_text: str | None) -> bool:
    """The files ``entry`` names hold what they should (a prune or a kill may have taken one)."""
    for sub, text, name in ((NAMES, names_text, entry[3]), (HOOKS, hooks_text, entry[2])):
        if not text:
            continue
        try:
            fd = os.open(os.path.basename(sub), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=top)
        except OSError:
            return False
        try:
            if _read_at(fd, name) != text:
                return False
        finally:
            os.close(fd)
    return True


def last_known(config_path: str) -> str | None:
    """The runtime last recorded for ``config_path``, whatever its identity: what the containers
    created under that config run with, and so what a broken config falls back to."""
    from nvct.base import fileutil

    try:
        top = fileutil.open_dir(CACHE_DIR)
    except OSError:
        return None
    try:
        if not fileutil.private(os.fstat(top)):
            return None
        runtime = _entries(top).get(config_path, (_NONE,))[0]
    finally:
        os.close(top)
    return runtime if runtime != _NONE and os.path.isabs(runtime) and os.access(runtime, os.X_OK) else None


def _entries(top: int) -> dict[str, tuple[str, str, str, str]]:
    entries: dict[str, tuple[str, str, str, str]] = {}
    text = _read_at(top, "runtimes")
    for line in (text or "").splitlines():
        fields = line.split("\t")
        if len(fields) == 5 and all(fields):
            entries[fields[0]] = (fields[1], fields[2], fields[3], fields[4])
    return entries


def _read_at(dir_fd: int, name: str) -> str | None:
    from nvct.base.parsecache import read_at

    data = read_at(dir_fd, name)
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _mark(seen: str | None | bool) -> str:
    if seen is None:
        return _ABSENT
    if seen is False or not isinstance(seen, str) or "\t" in seen:
        return _UNTRUSTED
    return seen


def _names_text(names: list[str]) -> str:
    """One name a line for ``grep -F -f``. A name that a line cannot hold exactly, one with a
    newline or NUL, is replaced by the empty line, which matches every spec: never a false no."""
    lines = ["" if ("\n" in n or "\0" in n) else n for n in names]
    return "".join(f"{line}\n" for line in lines)


def _hooks_text(legacy: tuple[str, dict[str, str]] | None) -> str:
    """``nvct_program`` and each of the record's ``nvct_<key>``, as sh assignments."""
    if not legacy:
        return ""
    program, record = legacy
    fields = {"program": program, **record}
    if any("\0" in v for v in fields.values()) or not all(k and k.replace("_", "a").isalnum() and k.isascii()
                                                           for k in fields):
        return ""
    return "".join(f"nvct_{k}={_sh(v)}\n" for k, v in fields.items())


def _fronts_text(entries: dict[str, tuple[str, str, str, str]]) -> str:
    """:data:`FRONTS`: the front's reading of runc's command line (nvct.oci.runcargs.front_sh), the
    config's path (nvct.config.file.default_path_sh), and each trusted entry as a ``case $config``
    arm setting the front's variables."""
    from nvct.config.file import default_path_sh
    from nvct.oci.runcargs import front_sh

    out = ["# nvct.oci.runtime's record for the sh fronts: sourced, never parsed; rewritten with runtimes.\n",
           f"nvct_stat={_sh(IDENTITY_FORMAT)}\n", front_sh(), default_path_sh(), "case $config in\n"]
    for config, (runtime, mark, hooks, names) in entries.items():
        if mark == _UNTRUSTED or "\0" in config + runtime:
            continue
        fields = ["nvct_absent=1" if mark == _ABSENT else f"nvct_ident={_sh(mark)}"]
        if runtime != _NONE:
            fields.append(f"nvct_runtime={_sh(runtime)}")
        if hooks != _NONE:
            fields.append(f"nvct_hooks={_sh(HOOKS + '/' + hooks)}")
        fields.append(f"nvct_names={_sh(NAMES + '/' + names)}")
        out.append(f"{_sh(config)}) {' '.join(fields)} ;;\n")
    return "".join(out) + "esac\n"


def _sh(value: str) -> str:
    """``value`` as one single-quoted sh word (shlex costs an import of re on every start)."""
    return "'" + value.replace("'", "'\\''") + "'"


def _content_name(text: str) -> str:
    """A file's name from its content (lowercase hex, what the fronts accept)."""
    try:
        from _blake2 import blake2b  # built in: hashlib would cost ~7 ms of imports here
    except ImportError:  # pragma: no cover - an interpreter without it
        from hashlib import blake2b
    return blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def _remove_stamps(top: int) -> None:
    """An older nvct's ``stamps`` folder (mtime stamps, superseded by the identity on the line)."""
    from nvct.base import fileutil

    fd = fileutil.open_private_dir(top, "stamps", create=False)
    if fd is None:
        return
    try:
        for name in os.listdir(fd):
            _unlink_at(fd, name)
    finally:
        os.close(fd)
    try:
        os.rmdir("stamps", dir_fd=top)
    except OSError:
        pass


def _prune(dir_fd: int, keep: set[str]) -> None:
    now = time.time_ns()
    for name in os.listdir(dir_fd):
        if name in keep:
            continue
        try:
            if now - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns < _YOUNG_NS:
                continue
        except OSError:
            continue
        _unlink_at(dir_fd, name)


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def execv(path: str, argv: list[str]) -> None:
    """Exec the low-level runtime with the environment the engine gave the shim, whole."""
    from nvct.oci import environ as hookenv

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
