"""nvct's configuration: the reference toolkit's ``config.toml``, same keys and defaults.

The shim reads this on every container start, so loading uses the standard
library's ``tomllib`` where it exists (Python 3.11+) and keeps tomlkit, which
preserves formatting for ``nvct config`` edits, off the hot path.

Lookup order: an explicit path, ``$NVIDIA_CTK_CONFIG_FILE_PATH``,
``${XDG_CONFIG_HOME:-/etc}/nvidia-container-runtime/config.toml``, then the
built-in defaults. A missing file means the defaults; a malformed one is an
error that names the file and the line.

nvct's own keys live in ``[nvct]``: ``dev-root`` (default: the driver root,
the reference's rule) and ``proc-root`` (see docs/configuration.md), with
``NVCT_DRIVER_ROOT``, ``NVCT_DEV_ROOT`` and ``NVCT_PROC_ROOT`` overriding the file.
"""

from __future__ import annotations

import os

from nvct.base.errors import ConfigError
from nvct.config import keys
from nvct.config.keys import ALL_CAPABILITIES

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any, Mapping

CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"
RELATIVE_PATH = "nvidia-container-runtime/config.toml"
_XDG_ENV, _XDG_DEFAULT = "XDG_CONFIG_HOME", "/etc"

#: The built-in defaults, in the reference's layout (from the table of keys).
DEFAULTS: dict[str, object] = keys.defaults()

_MODES = ("auto", "legacy", "cdi", "jit-cdi", "csv")


def default_path(env: Mapping[str, str] | None = None) -> str:
    """Where the config file is looked for when no path is given."""
    env = os.environ if env is None else env
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV]
    root = env.get(_XDG_ENV) or _XDG_DEFAULT
    return os.path.join(root, RELATIVE_PATH)


def default_path_sh() -> str:
    """:func:`default_path` as sh that sets ``$config``, for the sh fronts (they source it from
    nvct.oci.runtime.FRONTS): the same path for every environment, ``os.path.join`` included."""
    return (f'config=${{{CONFIG_ENV}:-}}\n'
            f'if [ -z "$config" ]; then\n'
            f'    config=${{{_XDG_ENV}:-{_XDG_DEFAULT}}}\n'
            f'    case $config in */) ;; *) config=$config/ ;; esac\n'
            f"    config=$config'{RELATIVE_PATH}'\n"
            f'fi\n')


class Config(keys.Settings):
    """Typed access to the merged configuration (file over defaults).

    Each key's accessor comes from the table (:class:`nvct.config.keys.Settings`):
    ``config.cli_load_kmods``, ``config.cdi_spec_dirs``. The properties below add
    what a key alone does not say (environment overrides, parsing).
    """

    def __init__(self, data: Mapping[str, object] | None = None, path: str | None = None,
                 env: Mapping[str, str] | None = None):
        self.path = path
        #: The content identity of the file read (nvct.base.parsecache.digest); None: the defaults.
        self.digest: str | None = None
        #: The bytes read (for nvct.base.parsecache.keep); None: the defaults.
        self.raw: bytes | None = None
        self._file = data or {}
        self.data = _merge(_copy(DEFAULTS), self._file)
        self._env = os.environ if env is None else env
        self._validate()

    def overridden(self, values: Mapping[keys.Key, object]) -> Config:
        """A copy with each row of ``values`` set to its value: a program's flags over the file."""
        data = _copy(self.data)
        for row, value in values.items():
            *tables, name = row.name.split(".")
            node = data
            for table in tables:
                node = node.setdefault(table, {})
            node[name] = value
        return Config(data, self.path, self._env)

    def get(self, dotted: str, default: object = None) -> object:
        """Look a key up by its dotted path, e.g. ``nvidia-container-runtime.mode``."""
        node: object = self.data
        for part in _split_key(dotted):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    # --- roots: the driver, /dev and /proc can each live elsewhere ---
    @property
    def driver_root(self) -> str:
        return self._env.get("NVCT_DRIVER_ROOT") or self.cli_root or "/"

    @property
    def dev_root(self) -> str:
        """Where ``dev/nvidia*`` are: as in the reference, the driver root unless set on its own."""
        return self._env.get("NVCT_DEV_ROOT") or self.nvct_dev_root or self.driver_root

    @property
    def dev_char_root(self) -> str:
        """Where the ``dev/char`` links go: the host's /dev, which systemd reads, unless a dev root is set.

        With the driver root as dev root (the GPU Operator), the links stay in the host's /dev/char
        and point into ``<driver root>/dev``, as the reference's create-dev-char-symlinks makes them.
        """
        return self._env.get("NVCT_DEV_ROOT") or self.nvct_dev_root or "/"

    @property
    def dev_root_source(self) -> str:
        """Why :attr:`dev_root` is what it is (``nvct doctor`` says it)."""
        if self._env.get("NVCT_DEV_ROOT"):
            return "set by NVCT_DEV_ROOT"
        if self.nvct_dev_root:
            return "set by nvct.dev-root"
        return "the driver root, as nvct.dev-root is not set"

    @property
    def proc_root(self) -> str:
        return self._env.get("NVCT_PROC_ROOT") or self.nvct_proc_root or "/proc"

    @property
    def supported_capabilities(self) -> tuple[str, ...]:
        raw = self.supported_driver_capabilities or ""
        return tuple(c for c in (s.strip() for s in raw.split(",")) if c)

    def unknown_keys(self) -> list[str]:
        """Keys of the file that no release gives a meaning (typos): warned about, never refused."""
        if _within(self._file, DEFAULTS):
            return []  # the usual file, on every GPU container start: no need for the whole key tree
        return keys.unknown(self._file)

    def unknown_keys_warning(self) -> str | None:
        """One line naming :meth:`unknown_keys`, or None when there are none."""
        found = self.unknown_keys()
        if not found:
            return None
        return keys.warning(self.path, found)

    def feature(self, name: str) -> bool:
        features: Any = self.get("features", {})
        return bool(features.get(name, False))

    def _validate(self) -> None:
        mode = self.mode
        if mode not in _MODES:
            raise ConfigError(
                f"{self.path or 'config'}: {keys.Settings.mode.name}: "
                f"unknown mode {mode!r} (expected one of {', '.join(_MODES)})"
            )
        if not isinstance(self.runtimes, list):
            raise ConfigError(f"{self.path or 'config'}: {keys.Settings.runtimes.name} must be a list")
        for cap in self.supported_capabilities:
            if cap not in ALL_CAPABILITIES:
                raise ConfigError(f"{self.path or 'config'}: {keys.Settings.supported_driver_capabilities.name}: "
                                  f"unknown capability {cap!r}")


def load(path: str | None = None, env: Mapping[str, str] | None = None, *, digest: str | None = None) -> Config:
    """Load the configuration by the reference's lookup order.

    ``digest``: the config the shim decided with (the legacy hook's env): its
    copy the shim kept (nvct.base.parsecache.keep), never the file read again,
    which may have been rewritten since; the file only where no copy is
    kept, and only while it still holds those bytes.
    """
    env = os.environ if env is None else env
    explicit = path is not None or digest is not None
    path = path or default_path(env)
    from nvct.base import parsecache

    raw = parsecache.kept(digest) if digest else None
    if raw is None:
        try:
            raw = read_whole(path)
        except FileNotFoundError:
            if explicit:
                raise ConfigError(f"{path}: config file not found") from None
            return Config(None, None, env)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
        if digest and parsecache.digest(raw) != digest:
            raise ConfigError(f"{path}: changed since the runtime accepted this container, and the runtime's "
                              f"copy of it is gone ({parsecache.ROOT}); start the container again")
    config = Config(_parse_cached(raw, path), path, env)
    config.digest, config.raw = digest or parsecache.digest(raw), raw
    return config


#: How long a read waits for a config's writer to finish.
_WRITER_WAIT_S = 1.0


def read_whole(path: str) -> bytes:
    """The config's bytes, never those of a write in progress.

    A file rewritten in place is empty or cut short while its writer works,
    and such a prefix is often valid TOML (the defaults, or half the keys).
    So the bytes count only when nobody has the file open for writing (a
    read lease, which the kernel refuses then) and it did not change while
    read. Else the read is retried for up to :data:`_WRITER_WAIT_S`, then it
    is an error naming the file.
    """
    import time

    deadline = None
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = os.fstat(fd)
            writer = _open_for_writing(fd)
            with open(fd, "rb", closefd=False) as f:
                raw = f.read()
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if not writer and len(raw) == after.st_size and (before.st_size, before.st_mtime_ns, before.st_ctime_ns) \
                == (after.st_size, after.st_mtime_ns, after.st_ctime_ns):
            return raw
        now = time.monotonic()
        deadline = deadline or now + _WRITER_WAIT_S
        if now >= deadline:
            raise ConfigError(f"{path}: being written by another process (open for writing, or changed "
                              "while read); not used")
        time.sleep(0.01)


def _open_for_writing(fd: int) -> bool:
    """Whether some process has the file open for writing: the kernel refuses a read lease (EAGAIN)."""
    import fcntl

    try:
        fcntl.fcntl(fd, 10, 23)  # F_SETSIG SIGURG (ignored): a lease break never kills us
        fcntl.fcntl(fd, 1024, fcntl.F_RDLCK)  # F_SETLEASE
    except OSError as e:
        import errno

        return e.errno == errno.EAGAIN  # else no lease here (not root, NFS, not a file): unknown
    fcntl.fcntl(fd, 1024, fcntl.F_UNLCK)
    return False


def _parse_cached(raw: bytes, path: str) -> dict:
    """``parse_toml``, remembered by content (nvct.base.parsecache): tomllib costs ~10 ms to import."""
    from nvct.base.parsecache import parse_cached

    data = parse_cached(raw, path, "config", lambda b: parse_toml(b, path))
    return data if isinstance(data, dict) else parse_toml(raw, path)


def parse_toml(raw: bytes, path: str) -> dict[str, object]:
    """Parse TOML, turning any syntax error into one line naming file and line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 at byte {e.start}") from None
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.9/3.10
        return _parse_with_tomlkit(text, path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {_toml_reason(str(e))}") from None


def _parse_with_tomlkit(text: str, path: str) -> dict[str, object]:
    import tomlkit
    import tomlkit.exceptions

    try:
        return tomlkit.parse(text).unwrap()
    except tomlkit.exceptions.TOMLKitError as e:
        raise ConfigError(f"{path}: invalid TOML: {_toml_reason(str(e))}") from None


def _toml_reason(msg: str) -> str:
    import re

    # tomllib says "... (at line 3, column 7)", tomlkit "... at line 3 col 7".
    m = re.search(r"\(?at line (\d+),? col(?:umn)? (\d+)\)?", msg)
    if not m:
        return msg
    what = msg[: m.start()].strip().rstrip(",")
    return f"line {m.group(1)}, column {m.group(2)}: {what}"


def _split_key(dotted: str) -> list[str]:
    # Top-level keys never contain dots, nested ones are table names.
    return dotted.split(".")


def _within(table: Mapping[str, object], known: Mapping[str, object]) -> bool:
    """Whether every key of ``table`` is one of ``known``'s, at every level."""
    for key, value in table.items():
        if key not in known:
            return False
        sub = known[key]
        if isinstance(value, dict) and isinstance(sub, dict) and not _within(value, sub):
            return False
    return True


def _copy(value):
    # copy.deepcopy would import weakref and friends on every container start.
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _merge(base: dict[str, object], over: Mapping[str, object]) -> dict[str, object]:
    for key, value in over.items():
        table = base.get(key)
        if isinstance(value, dict) and isinstance(table, dict):
            _merge(table, value)
        else:
            base[key] = value
    return base
