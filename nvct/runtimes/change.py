"""A planned set of file writes, and the undo record that lets them be reverted.

Configuring writes, beside the main config ``F``:

* ``F.nvct.bak`` -- ``F`` as it was before nvct first changed it (kept once made);
* ``F.nvct-undo`` -- JSON: for every file nvct wrote, its content before nvct
  touched it (or that it did not exist), a digest of what nvct wrote, and each
  key nvct changed with its old value.

Unconfiguring a file that still holds exactly what nvct wrote puts the old
bytes back (byte-identical; a file nvct created is removed). A file edited by
someone since is reverted key by key: only keys that still hold nvct's value
are restored, the rest are left alone and reported. Drop-in files get no
``.bak`` (CRI-O would parse it); their old content lives in the record.

The record is written before the configs, so a crash in between leaves a
record that unconfigure can still act on.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Callable

from nvct.errors import ConfigError
from nvct.fileutil import write_atomic
from nvct.runtimes import configured
from nvct.runtimes.document import Document, Edit, JsonDocument, TomlDocument, same

BACKUP_SUFFIX = ".nvct.bak"
RECORD_SUFFIX = ".nvct-undo"
RECORD_VERSION = 1


def backup_path(path: str) -> str:
    return path + BACKUP_SUFFIX


def record_path(path: str) -> str:
    return path + RECORD_SUFFIX


def digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


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
        for f in self.files:
            if f.changed:
                _write(f)
        if self.action == "unconfigure":
            _remove(record_path(self.anchor))
            configured.remove(self.anchor)
            self._drop_stale_backup()
            for directory in self.dirs_to_remove:
                try:
                    os.rmdir(directory)
                except OSError:
                    pass  # not empty (or gone): someone else uses it

    def _drop_stale_backup(self) -> None:
        """The backup is only worth keeping while it differs from the config."""
        bak = backup_path(self.anchor)
        try:
            with open(bak, "rb") as f:
                saved = f.read()
        except OSError:
            return
        try:
            with open(self.anchor, "rb") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if saved == current:
            os.unlink(bak)
        else:
            self.notes.append(f"kept {bak}: the config as it was before nvct first changed it")


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


# --------------------------------------------------------------------------- the record


def load_record(anchor: str) -> dict | None:
    path = record_path(anchor)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read nvct's undo record: {e.strerror}") from None
    try:
        record = json.loads(raw)
        if record.get("nvct-undo") != RECORD_VERSION or not isinstance(record.get("files"), list):
            raise ValueError("unknown format")
        for entry in record["files"]:
            entry["edits"] = [Edit.from_json(e) for e in entry.get("edits", [])]
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: nvct's undo record is unreadable ({e}); "
                          f"remove it to unconfigure without it") from None
    return record


def _write_record(path: str, record: dict | None) -> None:
    if record is None:
        _remove(path)
        return
    out = dict(record)
    out["files"] = [dict(e, edits=[x.to_json() for x in e["edits"]]) for e in record["files"]]
    text = json.dumps(out, indent=2, default=str) + "\n"
    try:
        write_atomic(path, text, mode=0o600)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write nvct's undo record: {e.strerror or e}") from None


def merged_record(old: dict | None, engine: str, files: list) -> dict:
    """The record after a configure: the first original of each file is kept."""
    entries = {e["path"]: e for e in (old or {}).get("files", [])}
    order = [e["path"] for e in (old or {}).get("files", [])]
    for f in files:
        if not f.changed:
            continue
        entry = entries.get(f.path)
        created_dirs = entry.get("created_dirs", []) if entry else _missing_dirs(f.path)
        if entry is None:
            original: dict | None = _original(f.before)
            edits = list(f.edits)
            order.append(f.path)
        elif digest(f.before) == entry["written"]:
            original, edits = entry["original"], merge_edits(entry["edits"], f.edits)
        elif entry["original"] is not None and _original_bytes(entry["original"]) == f.before:
            original, edits = entry["original"], list(f.edits)  # restored by hand since
        else:
            original, edits = None, merge_edits(entry["edits"], f.edits)  # edited by someone else
        entries[f.path] = {"path": f.path, "format": f.format, "original": original,
                           "written": digest(f.after), "edits": edits}
        if created_dirs:
            entries[f.path]["created_dirs"] = created_dirs
    return {"nvct-undo": RECORD_VERSION, "engine": engine, "files": [entries[p] for p in order]}


def merge_edits(old: list, new: list) -> list:
    """One edit per key, whose ``before`` is the value from before nvct's first edit."""
    result = list(old)
    for edit in new:
        idx = next((i for i, o in enumerate(result) if o.key == edit.key), None)
        if idx is None:
            result.append(edit)
            continue
        prior = result[idx]
        merged = Edit(edit.key, prior.before, edit.after) if same(prior.after, edit.before) else edit
        if same(merged.before, merged.after) and not merged.created_table:
            del result[idx]
        else:
            result[idx] = merged
    return result


def _missing_dirs(path: str) -> list:
    """Parent directories that writing ``path`` will create, outermost first."""
    missing = []
    directory = os.path.dirname(os.path.abspath(path))
    while directory and not os.path.exists(directory):
        missing.insert(0, directory)
        directory = os.path.dirname(directory)
    return missing


def _original(data: bytes | None) -> dict:
    if data is None:
        return {"exists": False}
    return {"exists": True, "text": data.decode("utf-8")}


def _original_bytes(original: dict) -> bytes | None:
    return original["text"].encode("utf-8") if original.get("exists") else None


def undo_from_record(record: dict, anchor: str, read: Callable[[str], bytes | None]) -> Change:
    """Plan putting back every file the record lists (latest written first)."""
    change = Change("unconfigure", record.get("engine", ""), anchor)
    for entry in reversed(record["files"]):
        path = entry["path"]
        current = read(path)
        original = entry.get("original")
        restored = _original_bytes(original) if original is not None else None
        if original is not None and digest(current) == entry["written"]:
            after = restored
        elif original is not None and current == restored:
            after = current
        elif current is None:
            after = None
            change.notes.append(f"{path}: removed since nvct configured it; nothing to undo")
        elif original is not None and not original.get("exists") and os.path.abspath(path) != os.path.abspath(anchor):
            # A drop-in nvct created: its import goes with the main file's undo, and a file
            # left behind (unimported, its version line reverted) would only mislead.
            after = None
            change.notes.append(f"{path}: changed since nvct created it; removed it all the same "
                                f"(nvct's drop-in; keep settings in {anchor})")
        else:
            doc = _document(entry["format"], path, current)
            skipped = doc.undo(entry["edits"])
            if original is not None and not original.get("exists") and doc.is_empty():
                doc.remove = True
            after = doc.render()
            change.notes += doc.notes
            change.notes.append(f"{path}: changed since nvct configured it; reverted nvct's keys only")
            change.notes += [f"{path}: left {key} alone: changed since nvct set it" for key in skipped]
        change.files.append(FileChange(path, entry["format"], current, after))
        if after is None:
            change.dirs_to_remove += list(reversed(entry.get("created_dirs", [])))
    return change


def _document(fmt: str, path: str, raw: bytes | None) -> Document:
    if fmt == "json":
        return JsonDocument(path, raw)
    if fmt == "toml":
        return TomlDocument(path, raw)
    raise ConfigError(f"{record_path(path)}: unknown file format {fmt!r} in nvct's undo record")


def file_change(doc: Document, *, backup: bool) -> FileChange:
    return FileChange(doc.path, doc.format, doc.original, doc.render(), list(doc.edits), backup)
