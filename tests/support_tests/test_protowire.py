from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, wrappers_pb2

from tests.support import protowire as pw


def test_encoding_matches_the_protobuf_library():
    # FileDescriptorProto: name=1 (string), dependency=3 (repeated string),
    # message_type=4 (message; DescriptorProto.name=1).
    ours = pw.message(pw.field(1, "api.proto"), pw.repeated(3, ["a", "b"]),
                      pw.submessage(4, pw.field(1, "M")))
    ref = descriptor_pb2.FileDescriptorProto(name="api.proto", dependency=["a", "b"])
    ref.message_type.add(name="M")
    assert ours == ref.SerializeToString()


@pytest.mark.parametrize("value", [1, 127, 128, 300, 2**40, -1, -998])
def test_varints_match_int64(value):
    assert pw.field(1, value) == wrappers_pb2.Int64Value(value=value).SerializeToString()
    assert pw.get_int(pw.parse(pw.field(1, value)), 1) == value


def test_defaults_are_omitted_but_empty_submessages_are_sent():
    assert pw.field(1, 0) == pw.field(2, False) == pw.field(3, "") == pw.field(4, None) == b""
    assert pw.submessage(5, b"") == b"\x2a\x00"


def test_maps_round_trip_sorted():
    encoded = pw.string_map(7, {"b": "2", "a": "1"})
    assert pw.get_map(pw.parse(encoded), 7) == {"a": "1", "b": "2"}
    assert encoded.index(b"a") < encoded.index(b"b")


def test_parse_nested_and_rejects_truncation():
    fields = pw.parse(pw.submessage(1, pw.field(1, "id") + pw.field(3, 2)))
    inner = pw.get_msg(fields, 1)
    assert (pw.get_str(inner, 1), pw.get_int(inner, 3)) == ("id", 2)
    with pytest.raises(ValueError, match="truncated"):
        pw.parse(b"\x08\x80")
