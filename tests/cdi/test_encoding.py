"""Spec files as text: YAML that every reader takes back as written, and JSON."""

from __future__ import annotations

import yaml
from hypothesis import given, settings, strategies as st

from nvct.cdi import encoding

_scalars = st.one_of(
    st.text(max_size=12), st.sampled_from(["0", "1:0", "0:0", "yes", "No", "on", "~", "null", "-", "--",
                                           "a: b", "#x", "2024-01-01", ".inf", "1e3", "0x1f", "=", "a:",
                                           "010", "1_0", "<<", "'q'", '"q"', "x::/y", "é", "\u2028"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.booleans(), st.none(),
)
_keys = st.text(min_size=1, max_size=8)
_documents = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(_keys, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _documents, max_size=5))
def test_yaml_round_trips_through_pyyaml_and_our_reader(document):
    text = encoding.dumps(document, "yaml")
    assert text.startswith("---\n")
    assert yaml.safe_load(text) == document
    assert encoding.loads(text) == document


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(_keys, _documents, max_size=5))
def test_json_round_trips(document):
    assert encoding.loads(encoding.dumps(document, "json")) == document


def test_strings_a_yaml_1_1_reader_would_retype_are_quoted():
    text = encoding.dumps({"a": ["1:0", "yes", "y", "0", "on", "null"]}, "yaml")
    assert text == '---\na:\n- "1:0"\n- "yes"\n- "y"\n- "0"\n- "on"\n- "null"\n'


def test_paths_and_names_stay_plain():
    text = encoding.dumps({"path": "/dev/nvidia0", "kind": "nvidia.com/gpu", "env": ["A=void"]}, "yaml")
    assert text == "---\npath: /dev/nvidia0\nkind: nvidia.com/gpu\nenv:\n- A=void\n"


def test_format_follows_the_extension():
    assert [encoding.format_for(p) for p in ("a.json", "a.YAML", "a.yml", "a", "a.txt")] == \
        ["json", "yaml", "yaml", None, None]
