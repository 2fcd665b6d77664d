"""ttrpc messages over NRI's multiplexed socket: the framing only, no dispatch.

NRI carries two ttrpc connections over one unix socket (containerd/nri's
``pkg/net/multiplex``): each mux frame is ``conn id`` and ``length`` (big
endian uint32 each) then that many bytes of that connection's stream.
Connection 1 is the plugin's ttrpc server (the runtime calls it), 2 the
runtime's (the plugin calls ``RegisterPlugin`` there). A connection's stream
is a sequence of ttrpc messages: ``length`` (uint32), ``stream id`` (uint32),
``type`` and ``flags`` (a byte each), big endian, then the protobuf
``Request`` or ``Response``. A message may span several mux frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterator

from nvct.nri import wire

PLUGIN_CONN, RUNTIME_CONN = 1, 2
MUX_HEADER = struct.Struct(">II")
HEADER = struct.Struct(">IIBB")
#: ttrpc's largest message, and so the largest mux frame (header included).
MESSAGE_MAX = 4 << 20
FRAME_MAX = HEADER.size + MESSAGE_MAX
REQUEST, RESPONSE, DATA = 1, 2, 3
#: google.rpc.Code values the plugin answers with.
OK, UNIMPLEMENTED, INTERNAL = 0, 12, 13


class ProtocolError(Exception):
    """The peer sent something that is not NRI's framing (the connection is dropped)."""


def mux_frame(conn: int, payload: bytes) -> bytes:
    """``payload`` on connection ``conn``, split into frames of at most FRAME_MAX."""
    out = bytearray()
    for start in range(0, max(len(payload), 1), FRAME_MAX):
        chunk = payload[start:start + FRAME_MAX]
        out += MUX_HEADER.pack(conn, len(chunk)) + chunk
    return bytes(out)


def message(stream_id: int, msg_type: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MESSAGE_MAX:
        raise ProtocolError(f"ttrpc message of {len(payload)} bytes exceeds {MESSAGE_MAX}")
    return HEADER.pack(len(payload), stream_id, msg_type, flags) + payload


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


class Demux:
    """Bytes from the socket in, ``(conn, Message)`` out, however the bytes were cut."""

    def __init__(self) -> None:
        self._trunk = bytearray()
        self._streams: dict[int, bytearray] = {}

    def feed(self, data: bytes) -> Iterator[tuple[int, Message]]:
        self._trunk += data
        while len(self._trunk) >= MUX_HEADER.size:
            conn, size = MUX_HEADER.unpack_from(self._trunk)
            if size > FRAME_MAX:
                raise ProtocolError(f"mux frame of {size} bytes exceeds {FRAME_MAX}")
            if conn not in (PLUGIN_CONN, RUNTIME_CONN):
                raise ProtocolError(f"mux frame for unknown connection {conn}")
            if len(self._trunk) < MUX_HEADER.size + size:
                return
            stream = self._streams.setdefault(conn, bytearray())
            stream += self._trunk[MUX_HEADER.size:MUX_HEADER.size + size]
            del self._trunk[:MUX_HEADER.size + size]
            yield from ((conn, m) for m in _messages(stream))


def _messages(stream: bytearray) -> Iterator[Message]:
    while len(stream) >= HEADER.size:
        length, stream_id, msg_type, flags = HEADER.unpack_from(stream)
        if length > MESSAGE_MAX:
            raise ProtocolError(f"ttrpc message of {length} bytes exceeds {MESSAGE_MAX}")
        if len(stream) < HEADER.size + length:
            return
        payload = bytes(stream[HEADER.size:HEADER.size + length])
        del stream[:HEADER.size + length]
        yield Message(stream_id, msg_type, flags, payload)


@dataclass(frozen=True)
class Request:
    service: str
    method: str
    payload: bytes = b""
    timeout_nano: int = 0
    metadata: list = field(default_factory=list)

    def encode(self) -> bytes:
        return (wire.string(1, self.service) + wire.string(2, self.method) + wire.string(3, self.payload)
                + wire.uint(4, self.timeout_nano))

    @classmethod
    def decode(cls, data: bytes) -> "Request":
        f = wire.parse(data)
        payload = f.get(3, [b""])[-1]
        return cls(wire.get_str(f, 1), wire.get_str(f, 2), payload if isinstance(payload, bytes) else b"",
                   wire.get_int(f, 4))


@dataclass(frozen=True)
class Response:
    code: int = OK
    message: str = ""
    payload: bytes = b""

    def encode(self) -> bytes:
        status = wire.uint(1, self.code) + wire.string(2, self.message)
        return wire.message(1, status) + wire.string(2, self.payload)

    @classmethod
    def decode(cls, data: bytes) -> "Response":
        f = wire.parse(data)
        status = wire.get_msg(f, 1)
        payload = f.get(2, [b""])[-1]
        return cls(wire.get_int(status, 1), wire.get_str(status, 2), payload if isinstance(payload, bytes) else b"")
