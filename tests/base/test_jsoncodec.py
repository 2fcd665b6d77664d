from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from nvct.base import jsoncodec

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=20)


@given(_values)
def test_dumps_and_loads_agree_with_the_json_package(value):
    assert jsoncodec.dumps(value) == json.dumps(value)
    assert jsoncodec.dumps(value, compact=True) == json.dumps(value, separators=(",", ":"))
    text = json.dumps(value)
    assert repr(jsoncodec.loads(text)) == repr(json.loads(text))
    assert repr(jsoncodec.loads(text.encode())) == repr(json.loads(text.encode()))


@pytest.mark.parametrize("text", ["", "{", "[1,]", '{"a":1} x', "nul", '{"a":"\\x"}', b'{"a": "\xff"}',
                                  "\ufeff{}", '{"a": 1}'.encode("utf-16")])
def test_bad_input_fails_as_json_loads_does(text):
    try:
        expected = ("ok", json.loads(text))
    except ValueError as e:
        expected = ("error", type(e), str(e))
    try:
        got = ("ok", jsoncodec.loads(text))
    except ValueError as e:
        got = ("error", type(e), str(e))
    assert got == expected


def test_neither_json_nor_re_is_imported_and_errors_still_read_well():
    code = ("import sys; from nvct.base import jsoncodec;"
            "assert jsoncodec.loads(' {\"a\": [1, 2.5, null]} ') == {'a': [1, 2.5, None]};"
            "assert jsoncodec.dumps({'a': ['x', True]}, compact=True) == '{\"a\":[\"x\",true]}';"
            "assert 're' not in sys.modules and 'json' not in sys.modules, sorted(sys.modules);"
            "jsoncodec.loads('{')")
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert "json.decoder.JSONDecodeError: Expecting property name" in proc.stderr, proc.stderr


def test_unserializable_values_raise_type_error():
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsoncodec.dumps({"a": object()})
