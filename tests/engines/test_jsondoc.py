"""JSON config files: key order and indentation kept (nvct.engines.jsondoc)."""

from __future__ import annotations

import pytest

from nvct.base.errors import ConfigError
from nvct.engines.document import JsonDocument


def test_json_keeps_key_order_and_indent_of_the_original():
    raw = b'{\n\t"b": 1,\n\t"a": {"x": true}\n}\n'
    doc = JsonDocument("d.json", raw)
    doc.set(("a", "y"), False)
    doc.set(("c",), "new")
    assert doc.render() == b'{\n\t"b": 1,\n\t"a": {\n\t\t"x": true,\n\t\t"y": false\n\t},\n\t"c": "new"\n}\n'


def test_json_without_nested_lines_uses_the_default_indent():
    doc = JsonDocument("d.json", b'{"a": 1}')
    doc.set(("b",), [1])
    assert doc.render() == b'{\n    "a": 1,\n    "b": [\n        1\n    ]\n}'


def test_json_unchanged_document_renders_the_original_bytes():
    raw = b'{ "a":1 }'
    assert JsonDocument("d.json", raw).render() == raw


@pytest.mark.parametrize("raw,message", [
    (b'{"a": 1,\n "b": }', "d.json: invalid JSON: line 2, column 7: Expecting value"),
    (b'[1, 2]', "d.json: not a JSON object (top level is a JSON array)"),
    (b'{"a": 1, "a": 2}', "d.json: invalid JSON: duplicate key 'a'"),
    (b'{"a": "\xff"}', "d.json: not valid UTF-8 at byte 7"),
])
def test_json_errors_are_one_line_naming_the_file(raw, message):
    with pytest.raises(ConfigError) as e:
        JsonDocument("d.json", raw)
    assert str(e.value) == message
