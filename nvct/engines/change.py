"""A planned set of file writes, and the undo record that lets them be reverted.

Configuring writes, beside the main config ``F``:

* ``F.nvct.bak`` -- ``F`` as it was before nvct first changed it: made only when no
  nvct run has written ``F`` yet (so it never holds nvct's own entries), and removed
  when the last change nvct recorded is undone;
* ``F.nvct-undo`` -- JSON, in layers, one per owner and run of changes (``nvct runtime
  configure``; one ``nvct toolkit install`` and its restarts): for every file a layer
  wrote, its content before that layer (or that it did not exist), what the layer last
  wrote, and each key it changed with its old value.

An undo belongs to its owner: it takes out that owner's layers and no other's, so an
installer that fails puts back the files as it found them, including what ``nvidia-ctk
runtime configure`` wrote before it. A file that still holds exactly what the layer last
wrote gets the layer's original bytes back (a file it created is removed). A file edited
by someone since is reverted key by key: only keys that still hold the layer's values are
restored; the rest, and what was changed since, are kept and named. Drop-in files get no
``.bak`` (CRI-O would parse it); their old content lives in the record.

The record is written before the configs, so a crash in between leaves a
record that unconfigure can still act on.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from nvct.base.errors import ConfigError
from nvct.base.fileutil import write_atomic
from nvct.engines import configured
from nvct.engines.document import Document
from nvct.engines.record import VERBATIM, record_path, render_record

BACKUP_SUFFIX = ".nvct.bak"
#: What nvct cannot tell (a file's content before nvct, when someone else edited it in between).
UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()


def backup_path(path: str) -> str:
    return path + BACKUP_SUFFIX


@dataclass
class FileChange:
    """One file's content before and after (None: the file does not exist)."""

    path: str
    format: str
    before: bytes | None
    after: bytes | None
    edits: list = field(default_factory=list)
    backup: bool = False

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        """A unified diff (empty when unchanged)."""
        if not self.changed:
            return ""
        a = _lines(self.before)
        b = _lines(self.after)
        out = difflib.unified_diff(a, b, fromfile=self.path if self.before is not None else "/dev/null",
                                   tofile=self.path if self.after is not None else "/dev/null")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                       for line in out)


def _lines(data: bytes | None) -> list:
    return [] if data is None else data.decode("utf-8", errors="replace").splitlines(keepends=True)


@dataclass
class Change:
    """What configure/unconfigure will write; nothing happens until :meth:`apply`."""

    action: str
    engine: str
    anchor: str
    files: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    #: The undo record after apply; None removes it.
    record: dict | None = None
    #: Directories configure created, removed again if empty (innermost first).
    dirs_to_remove: list = field(default_factory=list)
    #: unconfigure: the record is left as it is (nothing of the owner's was in it).
    keep_record: bool = False
    #: unconfigure of the last layer: the main config before nvct first changed it (None: it did
    #: not exist), or :data:`UNKNOWN`.
    backup_original: Any = UNKNOWN

    @property
    def changed(self) -> bool:
        return any(f.changed for f in self.files)

    @property
    def written(self) -> list:
        return [f.path for f in self.files if f.changed]

    def diff(self) -> str:
        return "".join(f.diff() for f in self.files)

    def apply(self) -> None:
        """Write the record (configure) then every changed file, each atomically."""
        if self.action == "configure":
            if not self.changed:
                return
            _makedirs(record_path(self.anchor))
            _write_record(record_path(self.anchor), self.record)
            configured.add(self.anchor, self.engine)
        elif self.keep_record:
            return
        for f in self.files:
            if f.changed:
                _write(f)
        if self.action == "unconfigure":
            _write_record(record_path(self.anchor), self.record)
            if self.record is None:
                configured.remove(self.anchor)
                self._drop_backup()
            for directory in self.dirs_to_remove:
                try:
                    os.rmdir(directory)
                except OSError:
                    pass  # not empty (or gone): someone else uses it

    def _drop_backup(self) -> None:
        """No nvct change is left: the backup goes, unless it is the only copy of the config before nvct."""
        bak = backup_path(self.anchor)
        try:
            with open(bak, "rb") as f:
                saved = f.read()
        except OSError:
            return
        try:
            with open(self.anchor, "rb") as f:
                current: bytes | None = f.read()
        except FileNotFoundError:
            current = None
        if saved != current and (saved == self.backup_original or self.backup_original is UNKNOWN):
            self.notes.append(f"kept {bak}: {self.anchor} as it was before nvct first changed it "
                              f"(it was changed since by someone else; compare, then remove the backup)")
            return
        _remove(bak)
        if saved != current:
            self.notes.append(f"removed {bak}: it did not hold {self.anchor} as it was before nvct "
                              f"(an older nvct saved its own entries there)")


def _write(f: FileChange) -> None:
    target = os.path.realpath(f.path) if os.path.islink(f.path) else f.path
    if f.after is None:
        _remove(target)
        return
    try:
        _makedirs(target)
        write_atomic(target, f.after, backup=backup_path(f.path) if f.backup else None)
    except OSError as e:
        raise ConfigError(f"{f.path}: cannot write: {e.strerror or e}") from None


def _makedirs(path: str) -> None:
    """Create the directories a file goes in (0755, as /etc's are)."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{path}: cannot create its directory: {e.strerror or e}") from None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ConfigError(f"{path}: cannot remove: {e.strerror}") from None


def file_change(doc: Document, *, backup: bool) -> FileChange:
    return FileChange(doc.path, doc.format, doc.original, doc.render(), list(doc.edits), backup)


def _write_record(path: str, record: dict | None) -> None:
    if record is None:
        _remove(path)
        return
    if isinstance(record.get(VERBATIM), str):  # the record as a layer found it, byte for byte
        text = record[VERBATIM]
    else:
        text = render_record(record)
    try:
        write_atomic(path, text, mode=0o600)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write nvct's undo record: {e.strerror or e}") from None
