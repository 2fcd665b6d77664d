"""One container-engine config file being edited, with every key-level edit recorded.

Engines say *what* to change by key path (``("runtimes", "nvidia")``); a
document says *how*, keeping everything else as it was: key order and
indentation for JSON, comments and layout for TOML (via tomlkit). Each
:class:`Edit` keeps the value that was there before, which is what lets
``unconfigure`` put back only what nvct changed when the file was edited by
someone else in between.

The formats live in nvct.engines.jsondoc and nvct.engines.tomldoc (tomlkit
only imported with a TOML file); their classes are importable from here.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from nvct.base.errors import ConfigError

__all__ = ["MISSING", "Edit", "Document", "same", "dotted"]  # and JsonDocument, TomlDocument (__getattr__)

Key = tuple  # tuple[str, ...]; a plain alias keeps Python 3.9 happy


class _Missing:
    """The value of a key that is not there (distinct from None/null)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __deepcopy__(self, memo):
        return self


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Edit:
    """One key set or deleted: ``before``/``after`` are plain values or MISSING."""

    key: Key
    before: Any
    after: Any

    def to_json(self) -> dict:
        out: dict = {"key": list(self.key)}
        if self.before is not MISSING:
            out["before"] = self.before
        if self.after is not MISSING:
            out["after"] = self.after
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Edit":
        return cls(tuple(data["key"]), data.get("before", MISSING), data.get("after", MISSING))

    @property
    def created_table(self) -> bool:
        """True for the record of a table that had to be created to hold a key."""
        return self.before is MISSING and self.after == {} and isinstance(self.after, dict)


def same(a: Any, b: Any) -> bool:
    """Equality that tells ``True`` from ``1`` and ignores dict order."""
    if type(a) is not type(b):
        if isinstance(a, dict) and isinstance(b, dict):
            pass
        elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            pass
        else:
            return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def dotted(key: Sequence[str]) -> str:
    return ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k) for k in key)


class Document:
    """A config file: read plain values, set/delete keys, render bytes."""

    format = ""

    def __init__(self, path: str, raw: bytes | None):
        self.path = path
        self.original = raw
        self.edits: list[Edit] = []
        #: What the operator should know about how the file was written.
        self.notes: list[str] = []
        #: render() returns None (file to be removed) when this is set.
        self.remove = False

    # --- to be provided by each format ---
    def _get(self, key: Key) -> Any:
        raise NotImplementedError

    def _set(self, key: Key, value: Any) -> None:
        raise NotImplementedError

    def _delete(self, key: Key) -> None:
        raise NotImplementedError

    def data(self) -> dict:
        """The whole document as plain Python values."""
        raise NotImplementedError

    def _render(self) -> bytes:
        raise NotImplementedError

    # --- shared behaviour ---
    def get(self, key: Sequence[str]) -> Any:
        """The plain value at ``key``, or MISSING."""
        return copy.deepcopy(self._get(tuple(key)))

    def set(self, key: Sequence[str], value: Any) -> None:
        """Set ``key`` to ``value``, creating parent tables; no-op if already so."""
        key = tuple(key)
        before = self._get(key)
        if same(before, value):
            return
        for i in range(1, len(key)):
            parent = self._get(key[:i])
            if parent is MISSING:
                self.edits.append(Edit(key[:i], MISSING, {}))
            elif not isinstance(parent, dict):
                raise ConfigError(f"{self.path}: {dotted(key[:i])} is not a table")
        self._set(key, copy.deepcopy(value))
        self.edits.append(Edit(key, copy.deepcopy(before), copy.deepcopy(value)))

    def delete(self, key: Sequence[str]) -> None:
        key = tuple(key)
        before = self._get(key)
        if before is MISSING:
            return
        self._delete(key)
        self.edits.append(Edit(key, copy.deepcopy(before), MISSING))

    def prune(self, key: Sequence[str], stop: int = 0) -> None:
        """Delete ``key`` and then each parent (down to ``stop`` parts) left empty."""
        key = tuple(key)
        while len(key) > stop and self._get(key) == {}:
            self.delete(key)
            key = key[:-1]

    def is_empty(self) -> bool:
        return not self.data()

    def render(self) -> bytes | None:
        """The new file content; None means the file is to be removed."""
        if self.remove:
            return None
        if not self.edits:
            return self.original
        return self._render()

    def undo(self, edits: Sequence[Edit]) -> list[str]:
        """Revert ``edits`` (latest first) where the value is still what nvct set.

        Returns the dotted keys left alone because someone changed them since.
        """
        skipped = []
        for edit in reversed(edits):
            current = self._get(edit.key)
            if edit.created_table:
                if current == {}:
                    self.delete(edit.key)
                continue
            if not same(current, edit.after):
                skipped.append(dotted(edit.key))
                continue
            if edit.before is MISSING:
                self.delete(edit.key)
            else:
                self.set(edit.key, edit.before)
        return skipped


def walk(data: Any, key: Key) -> Any:
    """The value at ``key`` in plain nested dicts, or MISSING."""
    node = data
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def decode(path: str, raw: bytes | None) -> str | None:
    """A config file's bytes as text (None: no file); ConfigError naming it if not UTF-8."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid UTF-8 at byte {e.start}") from None



def __getattr__(name: str) -> Any:
    """The format classes, by their old home's name; imported on first use (no cycle, no tomlkit)."""
    if name == "JsonDocument":
        from nvct.engines.jsondoc import JsonDocument

        return JsonDocument
    if name == "TomlDocument":
        from nvct.engines.tomldoc import TomlDocument

        return TomlDocument
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
