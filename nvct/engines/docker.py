"""Docker's ``daemon.json``.

Runtimes are ``{"path": ..., "runtimeArgs": [...]}``: ``runtimeArgs`` is the key
dockerd reads (the reference toolkit writes ``"args"``, which dockerd silently
ignores). Every other key is kept, ``features`` included, in its original order.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import ClassVar

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Document, JsonDocument
from nvct.engines.engine import Engine, get_table, read_file

RUNTIMES = ("runtimes",)
DEFAULT_RUNTIME = ("default-runtime",)
CDI = ("features", "cdi")

#: Names dockerd refuses for a runtime ("runtime name 'runc' is reserved").
RESERVED = ("runc",)


class DockerEngine(Engine):
    name = "docker"
    default_config = "/etc/docker/daemon.json"
    unset_default_on_add: ClassVar[bool] = False

    def open(self, path: str) -> Document:
        doc = JsonDocument(path, read_file(path), what="JSON object")
        get_table(doc, RUNTIMES, path)
        default = doc.get(DEFAULT_RUNTIME)
        if default is not MISSING and not isinstance(default, str):
            raise ConfigError(f"{path}: default-runtime is not a string")
        return doc

    def _check_drop_in(self, drop_in, explicit):
        if drop_in:
            raise ConfigError(f"{drop_in}: docker does not read drop-in config files")
        return None

    def add_runtime(self, name: str, path: str) -> None:
        if name in RESERVED:
            raise ConfigError(f"{self.config_path}: runtime name {name!r} is reserved by docker")
        entry = self._overrides({"path": path, "runtimeArgs": []})
        self.dest.set(RUNTIMES + (name,), entry)

    def set_default(self, name: str) -> None:
        self.dest.set(DEFAULT_RUNTIME, name)

    def unset_default(self, name: str) -> None:
        if self.dest.get(DEFAULT_RUNTIME) == name:
            self.dest.delete(DEFAULT_RUNTIME)

    def enable_cdi(self) -> None:
        get_table(self.dest, CDI[:1], self.config_path)
        self.dest.set(CDI, True)

    def remove_runtime(self, name: str) -> None:
        self.dest.delete(RUNTIMES + (name,))
        self.dest.prune(RUNTIMES)
        self.unset_default(name)

    def default_runtime(self) -> str | None:
        value = self.source.get("default-runtime")
        return value if isinstance(value, str) else None

    def runtime_binary(self, name: str) -> str | None:
        entry = get_table(self.source, RUNTIMES, self.config_path).get(name)
        path = entry.get("path") if isinstance(entry, dict) else None
        return path if isinstance(path, str) else None


def dockerd_pid(sock: str, pidfile: str) -> tuple[int | None, str]:
    """dockerd's pid, from whoever listens on its socket, else its pid file (never by name)."""
    notes = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(sock)
            pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
        if pid > 1:
            return pid, f"listening on {sock}"
        notes.append(f"{sock} is held by pid {pid} (socket activation)")
    except OSError as e:
        notes.append(f"{sock}: {e.strerror or e}")
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
        if pid > 1 and os.path.isdir(f"/proc/{pid}"):
            return pid, f"from {pidfile}"
        notes.append(f"{pidfile}: pid {pid} does not run")
    except (OSError, ValueError) as e:
        notes.append(f"{pidfile}: {getattr(e, 'strerror', None) or e}")
    return None, "; ".join(notes)
