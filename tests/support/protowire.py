"""Just enough of the protobuf wire format for a handful of CRI messages.

Generating classes needs protoc or grpc_tools, which Debian's python3-grpcio
does not bring; the few messages the tests send are simple enough to encode
by hand: varints, length-delimited strings/bytes/messages, and maps (which
are repeated key/value messages on the wire).
"""

from __future__ import annotations

from typing import Mapping

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives: ten-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(num: int, wire_type: int) -> bytes:
    return _varint(num << 3 | wire_type)


def field(num: int, value) -> bytes:
    """One field; proto3 defaults (0, False, "", b"", None) are omitted."""
    if value is None or isinstance(value, (bool, int)) and not value:
        return b""
    if isinstance(value, (bool, int)):
        return _key(num, _VARINT) + _varint(int(value))
    if isinstance(value, str):
        value = value.encode()
    if not value:
        return b""
    return _key(num, _LEN) + _varint(len(value)) + bytes(value)


def submessage(num: int, encoded: bytes) -> bytes:
    """A nested message, sent even when empty (its presence can matter)."""
    return _key(num, _LEN) + _varint(len(encoded)) + encoded


def repeated(num: int, values) -> bytes:
    return b"".join(field(num, v) for v in values)


def string_map(num: int, mapping: Mapping[str, str] | None) -> bytes:
    return b"".join(submessage(num, field(1, k) + field(2, v))
                    for k, v in sorted((mapping or {}).items()))


def message(*parts: bytes) -> bytes:
    return b"".join(parts)


def parse(data: bytes) -> dict[int, list]:
    """Field number -> values in order (ints for varint/fixed, bytes for LEN)."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        num, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _read_varint(data, pos)
        elif wire_type == _LEN:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire_type == _I64:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire_type == _I32:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        fields.setdefault(num, []).append(value)
    return fields


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def get_str(fields: dict, num: int, default: str = "") -> str:
    values = fields.get(num)
    return values[-1].decode(errors="replace") if values else default


def get_int(fields: dict, num: int, default: int = 0, *, signed: bool = True) -> int:
    values = fields.get(num)
    if not values:
        return default
    value = values[-1]
    return value - (1 << 64) if signed and value >= 1 << 63 else value


def get_msg(fields: dict, num: int) -> dict:
    values = fields.get(num)
    return parse(values[-1]) if values else {}


def get_map(fields: dict, num: int) -> dict[str, str]:
    out = {}
    for entry in fields.get(num, []):
        kv = parse(entry)
        out[get_str(kv, 1)] = get_str(kv, 2)
    return out
