"""Just enough of the protobuf wire format for a handful of CRI messages.

Generating classes needs protoc or grpc_tools, which Debian's python3-grpcio
does not bring. The bytes are nvct's own encoder and parser (nvct.nri.wire,
checked against the protobuf library in tests/support_tests); only the
CRI-shaped helpers here (defaults omitted, maps, signed ints) are the tests' own.
"""

from __future__ import annotations

from typing import Mapping

from nvct.nri.wire import get_map, message as submessage, parse, string, uint

__all__ = ["field", "get_int", "get_map", "get_msg", "get_str", "message", "parse", "repeated", "string_map",
           "submessage"]


def field(num: int, value) -> bytes:
    """One field; proto3 defaults (0, False, "", b"", None) are omitted."""
    if value is None:
        return b""
    if isinstance(value, (bool, int)):
        return uint(num, int(value))
    return string(num, value)


def repeated(num: int, values) -> bytes:
    return b"".join(field(num, v) for v in values)


def string_map(num: int, mapping: Mapping[str, str] | None) -> bytes:
    return b"".join(submessage(num, field(1, k) + field(2, v))
                    for k, v in sorted((mapping or {}).items()))


def message(*parts: bytes) -> bytes:
    return b"".join(parts)


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
