"""Add NVIDIA runtimes to docker, containerd and CRI-O configs, and take them out again.

The public API, shared by ``nvct runtime configure/unconfigure`` and the node
installer (which adds ``nvidia``, ``nvidia-cdi`` and ``nvidia-legacy`` in one go
and must undo them exactly on SIGTERM)::

    change = configure("containerd", runtimes={"nvidia": "/usr/bin/nvidia-container-runtime"},
                       set_default="nvidia", cdi=True)
    ...
    unconfigure("containerd")          # byte-identical when nothing else changed the files

Both return a :class:`Change` (its ``diff()`` is what ``--dry-run`` prints) and
write nothing when ``dry_run`` is true. Errors are
:class:`nvct.base.errors.ConfigError` with one line naming the file.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from nvct.base.errors import ConfigError
from nvct.engines.change import BACKUP_SUFFIX, Change, FileChange, backup_path, file_change
from nvct.engines.containerd import ContainerdEngine
from nvct.engines.crio import CrioEngine
from nvct.engines.docker import DockerEngine
from nvct.engines.document import JsonDocument
from nvct.engines.engine import Engine, Options, load_command_source, read_file
from nvct.engines.ocihook import DEFAULT_HOOK_BINARY, hook_json, hook_spec
from nvct.engines.record import CLI_OWNER, RECORD_SUFFIX, installer_owner, load_record, merged_record, record_path
from nvct.engines.undo import undo_from_record

__all__ = [
    "BACKUP_SUFFIX", "CLI_OWNER", "RECORD_SUFFIX", "DEFAULT", "ENGINES", "Change", "FileChange", "Engine", "Options",
    "installer_owner",
    "backup_path", "record_path", "configure", "unconfigure", "configure_hook", "unconfigure_hook",
    "open_engine", "low_level_runtime_paths", "hook_json", "DEFAULT_HOOK_BINARY",
]

ENGINES: dict = {"docker": DockerEngine, "containerd": ContainerdEngine, "crio": CrioEngine}


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: ``drop_in=DEFAULT``: the engine's usual drop-in beside the main config
#: (``conf.d/99-nvidia.toml`` for containerd, ``crio.conf.d/99-nvidia.toml`` for CRI-O), none for docker.
DEFAULT: Any = _Default()


def engine_class(name: str) -> type[Engine]:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown container engine {name!r} (expected one of {', '.join(ENGINES)})") from None


def open_engine(engine: str, config_path: str | None = None, *, drop_in: Any = DEFAULT,
                config_source: str = "file", executable: str | None = None,
                options: Options | None = None) -> Engine:
    """Load an engine's config (and, with ``config_source="command"``, ask the daemon)."""
    cls = engine_class(engine)
    path = config_path or cls.default_config
    explicit = drop_in is not DEFAULT
    drop_in = cls.drop_in_for(path) if drop_in is DEFAULT else (drop_in or None)
    notes = []
    source = None
    if config_source == "command":
        commands = cls.command_source(executable, path)
        if not commands:
            notes.append(f"{engine} cannot report its config: reading {path}")
        else:
            source, why = load_command_source(commands)
            if source is None:
                notes.append(f"could not ask {engine} for its config ({why}): reading {path}")
    elif config_source.startswith("file="):  # the GPU Operator's RUNTIME_CONFIG_SOURCE=file=PATH
        source = _file_source(config_source[5:].strip(), path, notes)
    elif config_source != "file":
        raise ConfigError(f"unknown config source {config_source!r} (expected file, file=PATH or command)")
    eng = cls(path, drop_in=drop_in, source=source, options=options, drop_in_explicit=explicit)
    eng.notes[:0] = notes
    return eng


def _file_source(source_path: str, path: str, notes: list) -> dict | None:
    """The engine's current settings read from ``source_path`` (TOML); None (the config itself) if it is absent."""
    from nvct.config.file import parse_toml

    try:
        with open(source_path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        notes.append(f"config source {source_path} does not exist: reading {path}")
        return None
    except OSError as e:
        raise ConfigError(f"config source {source_path}: {e.strerror}") from None
    return parse_toml(text, source_path)


def configure(engine: str, config_path: str | None = None,
              runtimes: Mapping[str, str] | None = None, *, set_default: str | None = None,
              cdi: bool = False, drop_in: Any = DEFAULT, config_source: str = "file",
              executable: str | None = None, options: Options | None = None,
              dry_run: bool = False, owner: str = CLI_OWNER) -> Change:
    """Add ``runtimes`` (name -> binary path) in one transaction; ``set_default`` names one of them.

    ``owner`` (the installer: its toolkit directory) is whose undo takes the change out again."""
    runtimes = dict(runtimes or {"nvidia": "/usr/bin/nvidia-container-runtime"})
    if set_default is not None and set_default not in runtimes:
        raise ConfigError(f"cannot make {set_default!r} the default runtime: it is not one being added")
    eng = open_engine(engine, config_path, drop_in=drop_in, config_source=config_source,
                      executable=executable, options=options)
    for name, path in runtimes.items():
        if not name:
            raise ConfigError("a runtime name must not be empty")
        eng.add_runtime(name, path)
        if name == set_default:
            eng.set_default(name)
        elif eng.unset_default_on_add:
            eng.unset_default(name)
    if cdi:
        eng.enable_cdi()
    eng.finish()
    change = Change("configure", engine, eng.config_path, notes=list(eng.notes))
    change.files = [file_change(doc, backup=doc is eng.main) for doc in eng.documents()]
    change.notes += [note for doc in eng.documents() for note in doc.notes]
    change.record = merged_record(load_record(eng.config_path), engine, change.files, owner)
    if not dry_run:
        change.apply()
    return change


def unconfigure(engine: str, config_path: str | None = None, runtimes: Sequence[str] = ("nvidia",), *,
                drop_in: Any = DEFAULT, dry_run: bool = False, owner: str | None = CLI_OWNER) -> Change:
    """Undo what ``owner``'s configure did to ``config_path`` (from nvct's record; None: every owner's).

    Without a record (the files were configured by something else), ``runtimes``
    are removed by name, the default runtime is unset if it is one of them, and
    the engine's drop-in file is removed.
    """
    cls = engine_class(engine)
    path = config_path or cls.default_config
    record = load_record(path)
    if record is not None:
        change = undo_from_record(record, path, read_file, owner)
    else:
        eng = open_engine(engine, path, drop_in=drop_in)
        if all(doc.original is None for doc in eng.documents()):
            raise ConfigError(f"{path}: no such config file (nor drop-in, nor nvct undo record): "
                              f"nothing to unconfigure")
        for name in runtimes:
            eng.remove_runtime(name)
        change = Change("unconfigure", engine, path, notes=list(eng.notes))
        change.files = [file_change(doc, backup=False) for doc in reversed(eng.documents())]
        change.notes.append(f"no nvct undo record beside {path}: removed runtimes "
                            f"{', '.join(runtimes)} by name")
    if not dry_run:
        change.apply()
    return change


def configure_hook(hook_path: str, hook_binary: str = DEFAULT_HOOK_BINARY, *,
                   dry_run: bool = False, owner: str = CLI_OWNER) -> Change:
    """Write the OCI hooks.d file (its undo record is ``<hook>.nvct-undo``, not read as a hook)."""
    doc = JsonDocument(hook_path, read_file(hook_path), what="OCI hook", indent="  ")
    spec = hook_spec(hook_binary)
    for key in [k for k in doc.data() if k not in spec]:
        doc.delete((key,))
    for key, value in spec.items():
        doc.set((key,), value)
    change = Change("configure", "oci-hook", hook_path)
    change.files = [file_change(doc, backup=True)]
    change.record = merged_record(load_record(hook_path), "oci-hook", change.files, owner)
    if not dry_run:
        change.apply()
    return change


def unconfigure_hook(hook_path: str, *, dry_run: bool = False, owner: str | None = CLI_OWNER) -> Change:
    """Put back what was at ``hook_path`` before ``owner`` wrote it (usually: nothing)."""
    record = load_record(hook_path)
    if record is not None:
        change = undo_from_record(record, hook_path, read_file, owner)
    else:
        current = read_file(hook_path)
        change = Change("unconfigure", "oci-hook", hook_path,
                        [FileChange(hook_path, "json", current, None)],
                        [f"no nvct undo record beside {hook_path}: removing it"])
    if not dry_run:
        change.apply()
    return change


def low_level_runtime_paths(engine: str, config_path: str | None = None, *, config_source: str = "file",
                            executable: str | None = None) -> list:
    """Binaries of the default runtime (unless nvidia*), runc and crun, as the engine has them."""
    return open_engine(engine, config_path, drop_in=None, config_source=config_source,
                       executable=executable).low_level_runtime_paths()
