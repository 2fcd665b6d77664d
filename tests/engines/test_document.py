"""Editing a config file by key, with a record of each edit (nvct.engines.document)."""

from __future__ import annotations

import json

import pytest

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Edit, JsonDocument, same


def test_same_tells_booleans_from_integers_and_ignores_dict_order():
    assert same({"a": 1, "b": [True]}, {"b": [True], "a": 1})
    assert not same(True, 1)
    assert not same({"a": 1}, {"a": 1.5})
    assert not same(MISSING, None)


def test_set_records_created_parents_and_the_previous_value():
    doc = JsonDocument("d.json", b'{"default-runtime": "runc"}')
    doc.set(("runtimes", "nvidia"), {"path": "/x"})
    doc.set(("default-runtime",), "nvidia")
    assert doc.edits == [
        Edit(("runtimes",), MISSING, {}),
        Edit(("runtimes", "nvidia"), MISSING, {"path": "/x"}),
        Edit(("default-runtime",), "runc", "nvidia"),
    ]


def test_setting_the_same_value_records_nothing():
    doc = JsonDocument("d.json", b'{"a": true}')
    doc.set(("a",), True)
    assert doc.edits == []


def test_setting_under_a_non_table_is_an_error():
    doc = JsonDocument("d.json", b'{"runtimes": "nope"}')
    with pytest.raises(ConfigError, match=r"^d.json: runtimes is not a table$"):
        doc.set(("runtimes", "nvidia"), {})


def test_undo_leaves_alone_what_someone_changed_since():
    doc = JsonDocument("d.json", b'{"default-runtime": "runc"}')
    doc.set(("default-runtime",), "nvidia")
    doc.set(("runtimes", "nvidia"), {"path": "/x"})
    edited = json.loads(doc.render())
    edited["default-runtime"] = "crun"
    again = JsonDocument("d.json", json.dumps(edited).encode())
    assert again.undo(doc.edits) == ["default-runtime"]
    assert again.data() == {"default-runtime": "crun"}
