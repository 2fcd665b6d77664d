"""The interface every container engine's config editor implements.

An engine reads the engine's config (a file, or what the daemon itself reports),
then writes the NVIDIA runtime entries into a destination document: the main
config, or a drop-in file where the engine supports one. Engines only say what
to change; documents keep the formatting and record the edits; a
:class:`nvct.engines.change.Change` writes the result.
"""

from __future__ import annotations

import copy
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Document

#: ``--config-source command`` gives up on a daemon that does not answer in time.
COMMAND_TIMEOUT_S = 30


@dataclass
class Options:
    """Settings the node installer needs beyond the CLI's flags."""

    #: containerd: runtime_type for a runtime whose options could not be copied.
    runtime_type: str = "io.containerd.runc.v2"
    #: containerd: prepended to each runtime's container_annotations (e.g. "cdi.k8s.io/*").
    container_annotations: Sequence[str] = ()
    #: Merged into every runtime entry written (the installer's runtime-config-override).
    runtime_overrides: Mapping[str, Any] = field(default_factory=dict)
    #: containerd: version for a config that does not exist yet (3 for containerd 2.x).
    config_version: int = 2
    #: containerd: the drop-in's directory as the daemon sees it, when nvct runs in a
    #: container with the host's /etc mounted elsewhere (goes into ``imports``).
    drop_in_host_path: str | None = None


class Engine:
    """A container engine's config: load, then add/remove runtimes, then render."""

    name: ClassVar[str] = ""
    default_config: ClassVar[str] = ""
    default_drop_in: ClassVar[str | None] = None
    #: Whether adding a runtime that is not to be the default un-sets it as default.
    unset_default_on_add: ClassVar[bool] = True

    def __init__(self, config_path: str, *, drop_in: str | None = None,
                 source: Mapping[str, Any] | None = None, options: Options | None = None,
                 drop_in_explicit: bool = True):
        self.config_path = config_path
        self.options = options or Options()
        self.notes: list[str] = []
        self.main = self.open(config_path)
        self.source: dict = dict(source) if source is not None else self.main.data()
        self.drop_in = self._check_drop_in(drop_in, drop_in_explicit)
        self.dest = self.open(self.drop_in) if self.drop_in else self.main

    # --- to be provided by each engine ---
    def open(self, path: str) -> Document:
        """Load one of this engine's files (missing: an empty document)."""
        raise NotImplementedError

    def add_runtime(self, name: str, path: str) -> None:
        raise NotImplementedError

    def set_default(self, name: str) -> None:
        raise NotImplementedError

    def unset_default(self, name: str) -> None:
        """Make sure ``name`` is not the default runtime."""
        raise NotImplementedError

    def enable_cdi(self) -> None:
        raise NotImplementedError

    def remove_runtime(self, name: str) -> None:
        """Remove ``name`` wherever this engine's files define it (no undo record)."""
        raise NotImplementedError

    def default_runtime(self) -> str | None:
        """The default runtime's name, as read from the source config."""
        raise NotImplementedError

    def runtime_binary(self, name: str) -> str | None:
        """The binary a runtime runs, as read from the source config."""
        raise NotImplementedError

    @classmethod
    def drop_in_for(cls, config_path: str) -> str | None:
        """The usual drop-in for a main config: beside it, as the default paths are."""
        if cls.default_drop_in is None:
            return None
        rel = os.path.relpath(cls.default_drop_in, os.path.dirname(cls.default_config))
        return os.path.join(os.path.dirname(os.path.abspath(config_path)), rel)

    @classmethod
    def command_source(cls, executable: str | None, config_path: str) -> list[list[str]]:
        """Commands that print the daemon's effective config as TOML, tried in order."""
        return []

    # --- shared behaviour ---
    def finish(self) -> None:
        """Last edits that depend on all the others (containerd's imports)."""

    def documents(self) -> list[Document]:
        """The files this engine may write, in the order they are written."""
        return [self.dest] if self.dest is self.main else [self.dest, self.main]

    def low_level_runtimes(self) -> list[str]:
        """Runtimes whose options a new runtime copies: the default (unless nvidia*), runc, crun."""
        names = []
        default = self.default_runtime()
        if default and not default.startswith("nvidia"):
            names.append(default)
        return names + [n for n in ("runc", "crun") if n not in names]

    def low_level_runtime_paths(self) -> list[str]:
        """Binaries of the low-level runtimes, for nvidia-container-runtime.runtimes."""
        out: list[str] = []
        for name in self.low_level_runtimes():
            path = self.runtime_binary(name)
            if path and path not in out:
                out.append(path)
        return out

    def _check_drop_in(self, drop_in: str | None, explicit: bool) -> str | None:
        if drop_in and not os.path.isabs(drop_in):
            raise ConfigError(f"{drop_in}: the drop-in config path must be absolute")
        return drop_in

    def _overrides(self, entry: dict) -> dict:
        _deep_merge(entry, copy.deepcopy(dict(self.options.runtime_overrides)))
        return entry


def read_file(path: str) -> bytes | None:
    """A config file's bytes; None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None


def load_command_source(commands: list[list[str]]) -> tuple[dict | None, str]:
    """Run the first command that works; its TOML output, or None and why not."""
    from nvct.config.file import parse_toml

    why = "no command to ask"
    for argv in commands:
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=COMMAND_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{' '.join(argv)}: {getattr(e, 'strerror', None) or e}"
            continue
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            why = f"{' '.join(argv)}: exit status {proc.returncode}" + (f": {err[-1]}" if err else "")
            continue
        try:
            return parse_toml(proc.stdout, " ".join(argv)), ""
        except ConfigError as e:
            why = str(e)
    return None, why


def get_table(doc: Document | Mapping[str, Any], key: Sequence[str], what: str) -> dict:
    """The table at ``key`` ({} when missing); anything else there is an error."""
    value = doc.get(tuple(key)) if isinstance(doc, Document) else get_plain(doc, key)
    if value is MISSING or value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what}: {'.'.join(key)} is not a table/object")
    return value


def get_plain(data: Mapping[str, Any], key: Sequence[str]) -> Any:
    """The value at ``key`` in plain nested dicts, or MISSING."""
    node: Any = data
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def _deep_merge(base: dict, over: Mapping[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
