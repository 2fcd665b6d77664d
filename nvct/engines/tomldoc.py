"""A TOML config file (containerd's, cri-o's) edited with tomlkit, as a :class:`~nvct.engines.document.Document`."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Document, Key, decode, same, walk


class TomlDocument(Document):
    """A TOML file edited with tomlkit: comments and layout of untouched parts kept.

    Values set under tables that already exist are changed in place. Whole new
    tables are held as plain dicts until :meth:`render`, then built in one go so
    their headers, indentation and blank lines match the neighbouring tables.
    The rendered text is parsed again and compared with what was intended; if
    tomlkit ever gets it wrong, the file is written plainly (comments lost)
    rather than wrongly.
    """

    format = "toml"

    def __init__(self, path: str, raw: bytes | None):
        super().__init__(path, raw)
        import tomlkit

        text = decode(path, raw) or ""
        _validate_toml(path, text)
        if text and not text.endswith("\n"):
            text += "\n"
        try:
            self._doc = tomlkit.parse(text)
        except Exception as e:  # noqa: BLE001 - tomlkit raises many types; all mean "bad input"
            raise ConfigError(f"{path}: invalid TOML: {_tomlkit_reason(e)}") from None
        self._pending: dict = {}

    # The tomlkit containers along ``key`` (None where a key is missing).
    def _container(self, key: Key) -> Any:
        node: Any = self._doc
        for part in key:
            if not _is_table(node) or part not in node:
                return None
            node = node[part]
        return node

    def _get(self, key: Key) -> Any:
        node = self._container(key)
        if node is None:
            return walk(self._pending, key)
        value = node.unwrap() if hasattr(node, "unwrap") else node
        extra = walk(self._pending, key)
        if isinstance(value, dict) and isinstance(extra, dict):
            _merge(value, extra)
        return value

    def _set(self, key: Key, value: Any) -> None:
        current = self._get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            # Sync an existing table in place: it keeps its position and comments.
            for k in [k for k in current if k not in value]:
                self._delete(key + (k,))
            for k, v in value.items():
                if not same(current.get(k, MISSING), v):
                    self._set(key + (k,), v)
            return
        parent = self._doc if len(key) == 1 else self._container(key[:-1])
        if parent is not None and _is_table(parent):
            if _is_inline(parent):
                parent[key[-1]] = value
                return
            if not isinstance(value, dict):
                self._set_scalar(parent, key[-1], value)
                return
            if key[-1] in parent:
                del parent[key[-1]]
        node = self._pending
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value

    def _set_scalar(self, parent: Any, name: str, value: Any) -> None:
        import tomlkit

        if name in parent:
            old = _item(parent, name)
            item = tomlkit.item(value)
            if hasattr(old, "trivia") and hasattr(item, "trivia"):
                item.trivia.indent = old.trivia.indent
                item.trivia.comment_ws = old.trivia.comment_ws
                item.trivia.comment = old.trivia.comment
                item.trivia.trail = old.trivia.trail
            parent[name] = item
            return
        indent = _kv_indent(parent, self._style())
        parent[name] = value
        item = _item(parent, name)
        if hasattr(item, "trivia"):
            item.trivia.indent = indent

    def _delete(self, key: Key) -> None:
        if self._container(key) is not None:
            parent = self._doc if len(key) == 1 else self._container(key[:-1])
            del parent[key[-1]]
        if walk(self._pending, key) is MISSING:
            return
        del walk(self._pending, key[:-1])[key[-1]]
        # Drop pending parents left empty: they were never in the file.
        for i in range(len(key) - 1, 0, -1):
            if walk(self._pending, key[:i]) == {}:
                parent = self._pending if i == 1 else walk(self._pending, key[: i - 1])
                del parent[key[i - 1]]

    def data(self) -> dict:
        out = self._doc.unwrap()
        _merge(out, self._pending)
        return out

    def _render(self) -> bytes:
        import tomlkit

        want = self.data()
        doc = copy.deepcopy(self._doc)
        _graft(doc, self._pending, (), self._style())
        text = tomlkit.dumps(doc)
        if _parses_to(text, want):
            return text.encode("utf-8")
        self.notes.append(f"{self.path}: could not keep its layout; written plainly, without comments")
        return tomlkit.dumps(want).encode("utf-8")

    def _style(self) -> "_Style":
        return _Style.of(self._doc)


def _validate_toml(path: str, text: str) -> None:
    """Reject what containerd/cri-o would reject, with line and column."""
    from nvct.config.file import parse_toml

    msg = None
    try:
        parse_toml(text.encode("utf-8"), path)
    except ConfigError as e:
        msg = str(e)
    if msg is None:
        return
    # tomllib's and tomlkit's (Python < 3.11) words for a key or table given twice.
    m = re.search(r"Cannot (?:overwrite a value|declare .* twice|mutate)|Key \".*\" already exists"
                  r"|Redefinition of an existing table", msg)
    if m:
        msg = msg[: m.start()] + "duplicate key or table"
    raise ConfigError(msg)


def _tomlkit_reason(e: Exception) -> str:
    msg = str(e)
    m = re.search(r"\s*at line (\d+) col (\d+)$", msg)
    if m:
        return f"line {m.group(1)}, column {m.group(2)}: {msg[: m.start()]}"
    return msg


def _is_table(node: Any) -> bool:
    from tomlkit.container import Container
    from tomlkit.items import AbstractTable

    return isinstance(node, (Container, AbstractTable)) or type(node).__name__ == "OutOfOrderTableProxy"


def _is_inline(node: Any) -> bool:
    from tomlkit.items import InlineTable

    return isinstance(node, InlineTable)


def _merge(base: dict, over: dict) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)


def _parses_to(text: str, want: dict) -> bool:
    try:
        import tomllib  # Python 3.11+
        got = tomllib.loads(text)
    except ImportError:  # pragma: no cover - Python 3.9/3.10
        import tomlkit

        got = tomlkit.parse(text).unwrap()
    except Exception:  # noqa: BLE001 - any failure to read it back means: do not trust the render
        return False
    return same(got, want)


@dataclass(frozen=True)
class _Style:
    """How this file lays tables out: indent step, and blank lines between tables."""

    step: int
    blank_lines: bool
    anchors: dict  # depth -> header indent (spaces)

    @classmethod
    def of(cls, doc: Any) -> "_Style":
        from tomlkit.items import Table

        anchors: dict = {}
        steps: list = []
        blank = False
        seen_table = False
        headers = 0

        def visit(container: Any, depth: int, prev_ws: bool) -> None:
            nonlocal blank, seen_table, headers
            from tomlkit.items import Whitespace

            for _key, item in container.body:
                if isinstance(item, Table):
                    if not item.is_super_table():
                        ind = len(item.trivia.indent.replace("\n", ""))
                        anchors.setdefault(depth + 1, ind)
                        if seen_table and (prev_ws or "\n" in item.trivia.indent):
                            blank = True
                        seen_table = True
                        headers += 1
                        kv = [i for kk, i in item.value.body if kk is not None and not isinstance(i, Table)]
                        if kv and hasattr(kv[0], "trivia"):
                            steps.append(len(kv[0].trivia.indent) - ind)
                    visit(item.value, depth + 1, prev_ws if item.is_super_table() else False)
                    prev_ws = _ends_blank(item)
                else:
                    prev_ws = isinstance(item, Whitespace) and "\n" in item.as_string()

        visit(doc, 0, False)
        step = max(steps[0], 0) if steps else 0
        # One table or none is no evidence of a compact style: use blank lines.
        return cls(step=step, blank_lines=blank or headers < 2, anchors=anchors)

    def header_indent(self, depth: int) -> str:
        if depth in self.anchors:
            return " " * self.anchors[depth]
        if self.anchors:
            near = min(self.anchors, key=lambda d: (abs(d - depth), d))
            return " " * max(self.anchors[near] + self.step * (depth - near), 0)
        return ""


def _ends_blank(table: Any) -> bool:
    return _body_ends_blank(table.value.body)


def _body_ends_blank(body: list) -> bool:
    """Whether the text of this container ends with a blank line (deepest last item)."""
    from tomlkit.items import Table, Whitespace

    if not body:
        return False
    last = body[-1][1]
    if isinstance(last, Table):
        return _body_ends_blank(last.value.body)
    return isinstance(last, Whitespace) and "\n" in last.as_string()


def _body(node: Any) -> list:
    from tomlkit.container import Container

    return node.body if isinstance(node, Container) else node.value.body


def _item(node: Any, key: str) -> Any:
    from tomlkit.container import Container

    return (node if isinstance(node, Container) else node.value).item(key)


def _kv_indent(parent: Any, style: _Style) -> str:
    from tomlkit.items import Comment, Table, Whitespace

    for k, item in _body(parent):
        if k is not None and not isinstance(item, (Table, Whitespace, Comment)) and hasattr(item, "trivia"):
            return item.trivia.indent
    if isinstance(parent, Table):
        return parent.trivia.indent.replace("\n", "") + " " * style.step
    return ""


def _graft(container: Any, pending: dict, prefix: Key, style: _Style) -> None:
    """Build each pending subtree as tomlkit tables under its existing parent."""
    for name, value in pending.items():
        key = prefix + (name,)
        if name in container and _is_table(container[name]):
            _graft(container[name], value, key, style)
        else:
            _append_table(container, name, value, key, style)


def _append_table(container: Any, name: str, value: dict, key: Key, style: _Style) -> None:
    import tomlkit

    body = _body(container)
    # The text before the new header may already end with a blank line (the one
    # that separated this container from what follows): then that blank line is
    # repeated after the new table instead of before it.
    blank_after = _body_ends_blank(body)
    blank_before = style.blank_lines and not blank_after and bool(body)
    container[name] = _build_table(value)
    table = _item(container, name)
    _layout(table, len(key), style, blank_before)
    if blank_after:
        _last_table(table).add(tomlkit.ws("\n"))


def _last_table(table: Any) -> Any:
    from tomlkit.items import Table

    subs = [i for _, i in table.value.body if isinstance(i, Table)]
    return _last_table(subs[-1]) if subs else table


def _build_table(value: dict) -> Any:
    """Scalars first, then sub-tables; a table holding only tables gets no header."""
    import tomlkit

    scalars = {k: v for k, v in value.items() if not isinstance(v, dict)}
    subtables = {k: v for k, v in value.items() if isinstance(v, dict)}
    table = tomlkit.table(is_super_table=not scalars and bool(subtables))
    for k, v in scalars.items():
        table.add(k, v)
    for k, v in subtables.items():
        table.add(k, _build_table(v))
    return table


def _layout(table: Any, depth: int, style: _Style, blank_before: bool) -> None:
    """Set header and key indentation (tomlkit shifts them while inserting)."""
    from tomlkit.items import Table

    header = style.header_indent(depth)
    is_super = table.is_super_table()
    table.trivia.indent = "" if is_super else ("\n" if blank_before else "") + header
    first = True
    for _, item in table.value.body:
        if isinstance(item, Table):
            blank = style.blank_lines and (not is_super or not first or blank_before)
            _layout(item, depth + 1, style, blank)
            first = False
        elif hasattr(item, "trivia"):
            item.trivia.indent = header + " " * style.step
