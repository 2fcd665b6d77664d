"""The protobuf wire format, as far as the NRI messages nvct reads and writes need it.

No protobuf library: the plugin sends four small messages and reads a few
fields of three; unknown fields are skipped, as protobuf readers do.
"""

from __future__ import annotations

from typing import Iterable, Mapping

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a protobuf message."""


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def key(num: int, wire_type: int) -> bytes:
    return varint(num << 3 | wire_type)


def uint(num: int, value: int) -> bytes:
    """A varint field; 0 (proto3's default) is not written."""
    return key(num, VARINT) + varint(value) if value else b""


def string(num: int, value: str | bytes) -> bytes:
    """A string/bytes field; empty is not written."""
    data = value.encode() if isinstance(value, str) else value
    return key(num, LEN) + varint(len(data)) + data if data else b""


def message(num: int, encoded: bytes) -> bytes:
    """A nested message, written even when empty (presence can matter)."""
    return key(num, LEN) + varint(len(encoded)) + encoded


def strings(num: int, values: Iterable[str]) -> bytes:
    return b"".join(message(num, v.encode()) for v in values)


def string_map(num: int, mapping: Mapping[str, str]) -> bytes:
    return b"".join(message(num, string(1, k) + string(2, v)) for k, v in sorted(mapping.items()))


def parse(data: bytes) -> dict[int, list]:
    """Field number -> its values in order (ints for varint and fixed, bytes for LEN)."""
    fields: dict[int, list] = {}
    pos, end = 0, len(data)
    value: int | bytes
    while pos < end:
        tag, pos = _read_varint(data, pos)
        num, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == LEN:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise WireError("truncated length-delimited field")
            value, pos = bytes(data[pos:pos + length]), pos + length
        elif wire_type in (I64, I32):
            size = 8 if wire_type == I64 else 4
            if pos + size > end:
                raise WireError("truncated fixed-size field")
            value, pos = int.from_bytes(data[pos:pos + size], "little"), pos + size
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        fields.setdefault(num, []).append(value)
    return fields


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def get_str(fields: dict, num: int) -> str:
    values = fields.get(num)
    return values[-1].decode("utf-8", "replace") if values else ""


def get_int(fields: dict, num: int) -> int:
    values = fields.get(num)
    return values[-1] if values else 0


def get_msg(fields: dict, num: int) -> dict:
    """A nested message's fields (repeated occurrences of a message field merge: the last wins per field)."""
    merged: dict[int, list] = {}
    for raw in fields.get(num, []):
        for k, v in parse(raw).items():
            merged.setdefault(k, []).extend(v)
    return merged


def get_map(fields: dict, num: int) -> dict[str, str]:
    out = {}
    for entry in fields.get(num, []):
        kv = parse(entry)
        out[get_str(kv, 1)] = get_str(kv, 2)
    return out
