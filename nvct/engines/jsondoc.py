"""A JSON object config file (docker's daemon.json, an OCI hook) as a :class:`~nvct.engines.document.Document`."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from nvct.base.errors import ConfigError
from nvct.engines.document import Document, Key, decode, walk


class JsonDocument(Document):
    """A JSON object file (docker's daemon.json, an OCI hook): order and indent kept."""

    format = "json"

    def __init__(self, path: str, raw: bytes | None, *, what: str = "JSON object", indent: str = "    "):
        super().__init__(path, raw)
        self._indent = indent
        self._newline = True
        text = decode(path, raw)
        if text is None or not text.strip():
            self._data: dict = {}
            return
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: invalid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from None
        except _DuplicateKey as e:
            raise ConfigError(f"{path}: invalid JSON: duplicate key {str(e)!r}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a {what} (top level is a JSON {_json_type(data)})")
        self._data = data
        self._indent = _json_indent(text, indent)
        self._newline = text.endswith("\n")

    def _get(self, key: Key) -> Any:
        return walk(self._data, key)

    def _set(self, key: Key, value: Any) -> None:
        node = self._data
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value

    def _delete(self, key: Key) -> None:
        node = walk(self._data, key[:-1])
        del node[key[-1]]

    def data(self) -> dict:
        return copy.deepcopy(self._data)

    def _render(self) -> bytes:
        text = json.dumps(self._data, indent=self._indent, ensure_ascii=False)
        return (text + ("\n" if self._newline else "")).encode("utf-8")


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _json_indent(text: str, default: str) -> str:
    """The indentation unit of the first nested line."""
    m = re.search(r"[\[{][ \t]*\r?\n([ \t]+)\S", text)
    return m.group(1) if m else default
