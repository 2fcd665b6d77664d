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
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from nvct.base.errors import ConfigError
from nvct.base.fileutil import write_atomic
from nvct.engines import configured
from nvct.engines.document import Document, Edit, JsonDocument, TomlDocument, same

BACKUP_SUFFIX = ".nvct.bak"
RECORD_SUFFIX = ".nvct-undo"
RECORD_VERSION = 2
#: The owner of the changes ``nvct runtime configure`` (and ``nvidia-ctk runtime configure``) makes.
CLI_OWNER = "nvct runtime configure"
#: Owners of installers' layers: this and the toolkit directory.
INSTALLER_OWNER = "nvct toolkit install "
#: An installed runtime (``<install-dir>/toolkit/nvidia-container-runtime[.mode]``) as a value in a record's edits.
_QUOTED_ROOT = re.compile(r'"(/[^"]*/toolkit)/nvidia-container-runtime(?:\.[a-z]+)?"')
#: Keys of a loaded record that are not written: its file's text, and the text to write instead.
_RAW, _VERBATIM = "-raw", "-verbatim"
#: What nvct cannot tell (a file's content before nvct, when someone else edited it in between).
UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()


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


# --------------------------------------------------------------------------- the record


def load_record(anchor: str) -> dict | None:
    """The record beside ``anchor`` (a version 1 record becomes one layer of no known owner)."""
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
        if record.get("nvct-undo") == 1 and isinstance(record.get("files"), list):
            record = {"nvct-undo": RECORD_VERSION, "engine": record.get("engine", ""),
                      "layers": [{"owner": None, "files": record["files"]}]}
        if record.get("nvct-undo") != RECORD_VERSION or not isinstance(record.get("layers"), list):
            raise ValueError("unknown format")
        for layer in record["layers"]:
            if not isinstance(layer.get("files"), list):
                raise ValueError("a layer without files")
            for entry in layer["files"]:
                entry["edits"] = [Edit.from_json(e) for e in entry.get("edits", [])]
        record[_RAW] = raw.decode("utf-8")
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: nvct's undo record is unreadable ({e}); "
                          f"remove it to unconfigure without it") from None
    return record


def _write_record(path: str, record: dict | None) -> None:
    if record is None:
        _remove(path)
        return
    if isinstance(record.get(_VERBATIM), str):  # the record as a layer found it, byte for byte
        text = record[_VERBATIM]
    else:
        text = _render_record(record)
    try:
        write_atomic(path, text, mode=0o600)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write nvct's undo record: {e.strerror or e}") from None


def _render_record(record: dict) -> str:
    out = {k: v for k, v in record.items() if k not in (_RAW, _VERBATIM)}
    out["layers"] = [dict(layer, files=[dict(e, edits=[x.to_json() for x in e["edits"]]) for e in layer["files"]])
                     for layer in record["layers"]]
    return json.dumps(out, indent=2, default=str) + "\n"


def merged_record(old: dict | None, engine: str, files: list, owner: str = CLI_OWNER) -> dict:
    """The record after ``owner`` configured ``files``.

    The owner's layer on top of the record takes the change (its first original is kept: a
    killed installer's successor restores what the first one found); otherwise a new layer
    goes on top, whose originals are the files as they are now. A file some layer already
    wrote gets no ``.bak``: that would be nvct's own content, not the config before nvct.
    """
    layers = [dict(layer) for layer in (old or {}).get("layers", [])]
    touched = {e["path"] for layer in layers for e in layer["files"]}
    for f in files:
        if f.path in touched:
            f.backup = False
    if layers and layers[-1].get("owner") is None and _owned(layers[-1], owner):
        layers[-1]["owner"] = owner  # an older nvct's record: the layer of the installer it names, or the CLI's
    if not layers or layers[-1].get("owner") != owner:
        # the record as this layer found it: what its undo writes back when nothing below changed
        layers.append({"owner": owner, "files": [], "record_below": (old or {}).get(_RAW)})
    top = layers[-1]
    entries = {e["path"]: e for e in top["files"]}
    order = [e["path"] for e in top["files"]]
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
                           "written": digest(f.after), "written_text": _text(f.after), "edits": edits}
        if created_dirs:
            entries[f.path]["created_dirs"] = created_dirs
    top["files"] = [entries[p] for p in order]
    if not top["files"]:
        layers.pop()
    return {"nvct-undo": RECORD_VERSION, "engine": engine, "layers": layers}


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
    missing: list[str] = []
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


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def owners(record: dict) -> list:
    """The owners of a record's layers, bottom first (None: a version 1 record's)."""
    return [layer.get("owner") for layer in record["layers"]]


def installer_owner(root: str) -> str:
    """The owner of the changes of ``nvct toolkit install`` with its toolkit directory at ``root``."""
    return INSTALLER_OWNER + root


def _owned(layer: dict, owner: str | None) -> bool:
    """``owner`` None undoes every layer. A layer of no known owner (an older nvct's record) is the
    installer's whose toolkit directory its values name, else ``nvct runtime configure``'s."""
    if owner is None or layer.get("owner") == owner:
        return True
    if layer.get("owner") is not None:
        return False
    text = json.dumps([e.to_json() for entry in layer["files"] for e in entry["edits"]])
    named = _QUOTED_ROOT.findall(text)
    if owner.startswith(INSTALLER_OWNER):
        return owner[len(INSTALLER_OWNER):] in named
    return owner == CLI_OWNER and not named


def undo_from_record(record: dict, anchor: str, read: Callable[[str], bytes | None],
                     owner: str | None = None) -> Change:
    """Plan undoing ``owner``'s layers (all with None), latest first; other owners' layers stay.

    Each file is compared with what the layer last wrote: when it is unchanged the layer's
    original comes back byte for byte; otherwise only the layer's keys that still hold its
    values are reverted, and what changed since (by someone else) is kept and named.
    """
    layers = record["layers"]
    mine = [i for i, layer in enumerate(layers) if _owned(layer, owner)]
    change = Change("unconfigure", record.get("engine", ""), anchor)
    if not mine:
        change.record, change.keep_record = record, True
        change.notes.append(f"{anchor}: nvct's undo record holds no change of {owner}'s (only of "
                            f"{', '.join(o or 'an older nvct' for o in owners(record))}): nothing to undo")
        return change
    remaining = [layer for i, layer in enumerate(layers) if i not in mine]
    before: dict = {}
    after: dict = {}
    formats: dict = {}
    for i in reversed(mine):
        above = [layer for layer in layers[i + 1:] if any(layer is r for r in remaining)]
        if above:
            # Another owner's changes build on these (its drop-in, its imports): they go together.
            _absorb(above[0], layers[i])
            change.notes.append(f"{anchor}: {above[0].get('owner')} changed it after {layers[i].get('owner')} "
                                f"did; the earlier changes are undone with its own")
            continue
        for entry in reversed(layers[i]["files"]):
            path = entry["path"]
            if path not in before:
                before[path] = after[path] = read(path)
            formats[path] = entry["format"]
            shared = any(path == e["path"] for layer in remaining for e in layer["files"])
            after[path] = _undo_entry(change, entry, anchor, after[path], shared)
            if after[path] is None:
                change.dirs_to_remove += list(reversed(entry.get("created_dirs", [])))
    change.files = [FileChange(path, formats[path], before[path], after[path]) for path in before]
    change.record = dict(record, layers=remaining) if remaining else None
    lowest = layers[mine[0]]
    if change.record and mine == list(range(mine[0], len(layers))) and isinstance(lowest.get("record_below"), str):
        change.record[_VERBATIM] = lowest["record_below"]
    bottom = next((e for layer in layers for e in layer["files"] if e["path"] == anchor), None)
    if not remaining and bottom is not None and bottom.get("original") is not None:
        change.backup_original = _original_bytes(bottom["original"])
    return change


def _undo_entry(change: Change, entry: dict, anchor: str, current: bytes | None, shared: bool) -> bytes | None:
    """What one layer's undo leaves of one file (``shared``: another layer that stays touches it)."""
    path = entry["path"]
    original = entry.get("original")
    restored = _original_bytes(original) if original is not None else None
    if original is not None and digest(current) == entry["written"]:
        return restored
    if original is not None and current == restored:
        return current
    if current is None:
        change.notes.append(f"{path}: removed since nvct configured it; nothing to undo")
        return None
    others = _changed_keys(entry, current)
    if original is not None and not original.get("exists") and not shared and \
            os.path.abspath(path) != os.path.abspath(anchor):
        # A drop-in nvct created: its import goes with the main file's undo, and a file
        # left behind (unimported, its version line reverted) would only mislead.
        change.notes.append(f"{path}: changed since nvct created it{others}; removed it all the same "
                            f"(nvct's drop-in; keep settings in {anchor})")
        return None
    doc = _document(entry["format"], path, current)
    skipped = doc.undo(entry["edits"])
    if original is not None and not original.get("exists") and doc.is_empty():
        doc.remove = True
    change.notes += doc.notes
    change.notes.append(f"{path}: changed since nvct last wrote it{others}; kept those changes and "
                        f"reverted nvct's own keys only")
    change.notes += [f"{path}: left {key} alone: changed since nvct set it" for key in skipped]
    return doc.render()


def _changed_keys(entry: dict, current: bytes) -> str:
    """`` (changed: a, b.c)``: the keys whose values differ from what nvct last wrote ('' if unknown)."""
    written = entry.get("written_text")
    if written is None:
        return ""
    try:
        old = _document(entry["format"], entry["path"], written.encode("utf-8")).data()
        new = _document(entry["format"], entry["path"], current).data()
    except ConfigError:
        return ""
    keys = _diff_keys(old, new, ())
    if not keys:
        return " (formatting or comments only)"
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return f" (by someone else: {shown})"


def _diff_keys(a: Any, b: Any, prefix: tuple) -> list:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                out.append(".".join(prefix + (str(key),)))
            else:
                out += _diff_keys(a[key], b[key], prefix + (str(key),))
        return out
    return [] if same(a, b) else [".".join(prefix) or "(the whole file)"]


def _absorb(upper: dict, lower: dict) -> None:
    """``upper`` takes over ``lower``'s changes: its undo puts back the files as they were before both."""
    entries = {e["path"]: e for e in upper["files"]}
    upper["record_below"] = None  # the record below it changes now
    for old in lower["files"]:
        entry = entries.get(old["path"])
        if entry is None:
            upper["files"].insert(0, old)
            continue
        entry["edits"] = merge_edits(old["edits"], entry["edits"])
        entry["original"] = old["original"] if entry.get("original") is not None else None
        if old.get("created_dirs"):
            entry["created_dirs"] = old["created_dirs"]


def _document(fmt: str, path: str, raw: bytes | None) -> Document:
    if fmt == "json":
        return JsonDocument(path, raw)
    if fmt == "toml":
        return TomlDocument(path, raw)
    raise ConfigError(f"{record_path(path)}: unknown file format {fmt!r} in nvct's undo record")


def file_change(doc: Document, *, backup: bool) -> FileChange:
    return FileChange(doc.path, doc.format, doc.original, doc.render(), list(doc.edits), backup)
