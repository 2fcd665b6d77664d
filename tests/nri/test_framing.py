"""NRI's mux and ttrpc framing and the plugin's replies, against bytes recorded from containerd 2.1.9.

The recording (data/containerd-2.1.9.json) is one real session: the plugin's
RegisterPlugin, containerd's answer, Configure, Synchronize and a
CreateContainer (pod annotation ``nvidia.cdi.k8s.io/container.app:
vendor.example/x=1``), each chunk as recv/sendall saw it (a mux header
arrives apart from its payload). Replayed through a socketpair, the plugin
must answer byte for byte as it did.
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from nvct.nri import messages as m, ttrpc, wire
from nvct.nri.plugin import Plugin, Policy

DATA = os.path.join(os.path.dirname(__file__), "data", "containerd-2.1.9.json")


def trace() -> list[tuple[str, bytes]]:
    with open(DATA) as f:
        return [(d, bytes.fromhex(h)) for d, h in json.load(f)["trace"]]


def incoming() -> bytes:
    return b"".join(data for d, data in trace() if d == "in")


def outgoing() -> list[bytes]:
    return [data for d, data in trace() if d == "out"]


def demuxed(chunks) -> list[tuple[int, ttrpc.Message]]:
    demux = ttrpc.Demux()
    return [item for chunk in chunks for item in demux.feed(chunk)]


def test_the_recorded_stream_demuxes_into_containerds_messages():
    got = demuxed([incoming()])
    assert [(conn, msg.type, msg.stream_id) for conn, msg in got] == [
        (ttrpc.RUNTIME_CONN, ttrpc.RESPONSE, 1),  # RegisterPlugin's answer
        (ttrpc.PLUGIN_CONN, ttrpc.REQUEST, 1), (ttrpc.PLUGIN_CONN, ttrpc.REQUEST, 3),
        (ttrpc.PLUGIN_CONN, ttrpc.REQUEST, 5)]
    assert ttrpc.Response.decode(got[0][1].payload).code == ttrpc.OK
    requests = [ttrpc.Request.decode(msg.payload) for _, msg in got[1:]]
    assert [(r.service, r.method) for r in requests] == [(m.PLUGIN_SERVICE, "Configure"),
                                                        (m.PLUGIN_SERVICE, "Synchronize"),
                                                        (m.PLUGIN_SERVICE, "CreateContainer")]
    assert all(r.timeout_nano > 0 for r in requests)
    configure = m.Configure.decode(requests[0].payload)
    assert (configure.runtime_name, configure.runtime_version) == ("containerd", "2.1.9+unknown")
    assert not m.synchronize_more(requests[1].payload)
    pod, container = m.create_container_request(requests[2].payload)
    assert (pod.namespace, pod.name, container.name) == ("default", "pod-18871-fbc5f33b", "app")
    assert pod.annotations["nvidia.cdi.k8s.io/container.app"] == "vendor.example/x=1"


@pytest.mark.parametrize("size", [1, 3, 7, 11, 4096])
def test_any_cut_of_the_stream_gives_the_same_messages(size):
    data = incoming()
    whole = demuxed([data])
    assert demuxed(data[i:i + size] for i in range(0, len(data), size)) == whole


def test_the_plugins_frames_are_the_recorded_ones():
    register, configured, synced, created = outgoing()
    request = ttrpc.Request(m.RUNTIME_SERVICE, "RegisterPlugin",
                            m.register_plugin_request("nvidia-ctk-installer", "10"))
    assert ttrpc.mux_frame(ttrpc.RUNTIME_CONN, ttrpc.message(1, ttrpc.REQUEST, request.encode())) == register
    reply = ttrpc.Response(payload=m.configure_response(m.event_mask(m.CREATE_CONTAINER)))
    assert ttrpc.mux_frame(ttrpc.PLUGIN_CONN, ttrpc.message(1, ttrpc.RESPONSE, reply.encode())) == configured
    assert m.event_mask(m.CREATE_CONTAINER) == 8  # api.proto: 1 << (CREATE_CONTAINER - 1)
    adjust = wire.get_msg(wire.parse(ttrpc.Response.decode(demuxed([created])[0][1].payload).payload), 1)
    assert [wire.get_str(wire.parse(d), 1) for d in adjust[8]] == ["vendor.example/x=1"]  # CDI_devices = 8


def test_replayed_through_a_socket_the_plugin_answers_as_recorded():
    runtime, plugin_end = socket.socketpair()
    log: list[str] = []
    plugin = Plugin("/nonexistent/nri.sock", "10", Policy(["gpu-operator"]), log.append)
    thread = threading.Thread(target=plugin._serve, args=(plugin_end,))
    thread.start()
    sent = []
    try:
        for direction, data in trace():
            if direction == "in" and data:
                runtime.sendall(data)
            elif direction == "out":
                sent.append(_read_exactly(runtime, len(data)))
    finally:
        runtime.shutdown(socket.SHUT_RDWR)
        thread.join(5)
        runtime.close()
        plugin_end.close()
    assert sent == outgoing()
    assert plugin.registrations == 1
    assert "NRI: default/pod-18871-fbc5f33b/app: injecting CDI devices vendor.example/x=1" in log


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    out = b""
    sock.settimeout(5)
    while len(out) < size:
        chunk = sock.recv(size - len(out))
        assert chunk, f"connection closed after {len(out)} of {size} bytes"
        out += chunk
    return out


def test_a_frame_for_an_unknown_connection_or_too_long_is_refused():
    with pytest.raises(ttrpc.ProtocolError, match="unknown connection 9"):
        demuxed([ttrpc.MUX_HEADER.pack(9, 0)])
    with pytest.raises(ttrpc.ProtocolError, match="exceeds"):
        demuxed([ttrpc.MUX_HEADER.pack(1, ttrpc.FRAME_MAX + 1)])
    with pytest.raises(ttrpc.ProtocolError, match="exceeds"):
        demuxed([ttrpc.mux_frame(1, ttrpc.HEADER.pack(ttrpc.MESSAGE_MAX + 1, 1, 1, 0))])


def test_a_request_the_plugin_cannot_decode_fails_with_a_status_not_a_traceback():
    plugin = Plugin("/nonexistent", "10", Policy([]), lambda line: None)
    reply = plugin._answer(ttrpc.Request(m.PLUGIN_SERVICE, "CreateContainer", b"\x0a\xff"))
    assert reply.code == ttrpc.INTERNAL and "cannot decode" in reply.message
    reply = plugin._answer(ttrpc.Request("other.Service", "Call"))
    assert reply.code == ttrpc.UNIMPLEMENTED


def test_a_synchronize_in_parts_is_answered_more_until_the_last():
    plugin = Plugin("/nonexistent", "10", Policy([]), lambda line: None)
    assert wire.get_int(wire.parse(plugin.handle("Synchronize", wire.uint(3, 1))), 2) == 1
    assert plugin.handle("Synchronize", b"") == b""
