"""Undoing an owner's layers of nvct's undo record: the files as they were, or nvct's keys reverted."""

from __future__ import annotations

import os
from typing import Any, Callable

from nvct.base.errors import ConfigError
from nvct.engines.change import Change, FileChange
from nvct.engines.document import Document, JsonDocument, TomlDocument, same
from nvct.engines.record import VERBATIM, digest, merge_edits, original_bytes, owned, owners, record_path


def undo_from_record(record: dict, anchor: str, read: Callable[[str], bytes | None],
                     owner: str | None = None) -> Change:
    """Plan undoing ``owner``'s layers (all with None), latest first; other owners' layers stay.

    Each file is compared with what the layer last wrote: when it is unchanged the layer's
    original comes back byte for byte; otherwise only the layer's keys that still hold its
    values are reverted, and what changed since (by someone else) is kept and named.
    """
    layers = record["layers"]
    mine = [i for i, layer in enumerate(layers) if owned(layer, owner)]
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
        change.record[VERBATIM] = lowest["record_below"]
    bottom = next((e for layer in layers for e in layer["files"] if e["path"] == anchor), None)
    if not remaining and bottom is not None and bottom.get("original") is not None:
        change.backup_original = original_bytes(bottom["original"])
    return change


def _undo_entry(change: Change, entry: dict, anchor: str, current: bytes | None, shared: bool) -> bytes | None:
    """What one layer's undo leaves of one file (``shared``: another layer that stays touches it)."""
    path = entry["path"]
    original = entry.get("original")
    restored = original_bytes(original) if original is not None else None
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
