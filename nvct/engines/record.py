"""nvct's undo record: its format, and the layers each owner's configuring adds to it.

The record is described in :mod:`nvct.engines.change`, which writes it before the configs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from nvct.base.errors import ConfigError
from nvct.engines.document import Edit, same

RECORD_SUFFIX = ".nvct-undo"
RECORD_VERSION = 2
#: The owner of the changes ``nvct runtime configure`` (and ``nvidia-ctk runtime configure``) makes.
CLI_OWNER = "nvct runtime configure"
#: Owners of installers' layers: this and the toolkit directory.
INSTALLER_OWNER = "nvct toolkit install "
#: An installed runtime (``<install-dir>/toolkit/nvidia-container-runtime[.mode]``) as a value in a record's edits.
_QUOTED_ROOT = re.compile(r'"(/[^"]*/toolkit)/nvidia-container-runtime(?:\.[a-z]+)?"')
#: Keys of a loaded record that are not written: its file's text, and the text to write instead.
_RAW, VERBATIM = "-raw", "-verbatim"


def record_path(path: str) -> str:
    return path + RECORD_SUFFIX


def digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


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


def render_record(record: dict) -> str:
    out = {k: v for k, v in record.items() if k not in (_RAW, VERBATIM)}
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
    if layers and layers[-1].get("owner") is None and owned(layers[-1], owner):
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
        elif entry["original"] is not None and original_bytes(entry["original"]) == f.before:
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


def original_bytes(original: dict) -> bytes | None:
    return original["text"].encode("utf-8") if original.get("exists") else None


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def owners(record: dict) -> list:
    """The owners of a record's layers, bottom first (None: a version 1 record's)."""
    return [layer.get("owner") for layer in record["layers"]]


def installer_owner(root: str) -> str:
    """The owner of the changes of ``nvct toolkit install`` with its toolkit directory at ``root``."""
    return INSTALLER_OWNER + root


def owned(layer: dict, owner: str | None) -> bool:
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
