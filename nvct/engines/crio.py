"""CRI-O's ``crio.conf`` and its ``crio.conf.d`` drop-ins.

A runtime is ``[crio.runtime.runtimes.<name>]`` with ``runtime_path`` and
``runtime_type = "oci"``; everything else (``runtime_root``, ``monitor_path``,
``monitor_cgroup``, ``monitor_env``, ...) is copied from the default runtime,
else runc, else crun, as the reference toolkit does. CRI-O enables CDI by
itself, so ``--cdi.enabled`` changes nothing.

CRI-O parses *every* file in ``crio.conf.d`` (whatever its name), so nvct never
leaves a backup or an undo record there.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from nvct.base.errors import ConfigError
from nvct.engines.document import Document, TomlDocument
from nvct.engines.engine import Engine, get_plain, get_table, read_file

RUNTIMES = ("crio", "runtime", "runtimes")
DEFAULT_RUNTIME = ("crio", "runtime", "default_runtime")


class CrioEngine(Engine):
    name = "crio"
    default_config = "/etc/crio/crio.conf"
    default_drop_in = "/etc/crio/crio.conf.d/99-nvidia.toml"

    def __init__(self, config_path: str, **kwargs: Any):
        super().__init__(config_path, **kwargs)
        if self.dest is self.main and os.path.basename(os.path.dirname(os.path.abspath(config_path))).endswith(".d"):
            raise ConfigError(f"{config_path}: cri-o reads every file in its directory, nvct's backup "
                              f"and undo record included; edit it through --drop-in-config instead")

    def open(self, path: str) -> Document:
        doc = TomlDocument(path, read_file(path))
        get_table(doc, RUNTIMES, path)
        return doc

    def add_runtime(self, name: str, path: str) -> None:
        get_table(self.dest, RUNTIMES, self.dest.path)
        entry = self._copied_options()
        entry["runtime_path"] = path
        entry["runtime_type"] = "oci"
        self.dest.set(RUNTIMES + (name,), self._overrides(entry))

    def set_default(self, name: str) -> None:
        self.dest.set(DEFAULT_RUNTIME, name)

    def unset_default(self, name: str) -> None:
        for doc in self.documents():
            if doc.get(DEFAULT_RUNTIME) == name:
                doc.delete(DEFAULT_RUNTIME)

    def enable_cdi(self) -> None:
        self.notes.append("cri-o enables CDI by itself: --cdi.enabled changes nothing")

    def remove_runtime(self, name: str) -> None:
        if self.drop_in:
            self.dest.remove = True
        for doc in self.documents():
            doc.delete(RUNTIMES + (name,))
            doc.prune(RUNTIMES, stop=0)
        self.unset_default(name)

    def _copied_options(self) -> dict:
        runtimes = get_table(self.source, RUNTIMES, "cri-o config source")
        for name in self.low_level_runtimes():
            if isinstance(runtimes.get(name), dict):
                return copy.deepcopy(runtimes[name])
        return {}

    def default_runtime(self) -> str | None:
        value = get_plain(self.source, DEFAULT_RUNTIME)
        return value if isinstance(value, str) else None

    def runtime_binary(self, name: str) -> str | None:
        entry = get_plain(self.source, RUNTIMES + (name,))
        path = entry.get("runtime_path") if isinstance(entry, dict) else None
        return path if isinstance(path, str) else None

    @classmethod
    def command_source(cls, executable: str | None, config_path: str) -> list[list[str]]:
        return [[executable or "crio", "status", "config"], ["crio-status", "config"]]
