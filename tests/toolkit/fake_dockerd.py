"""A stand-in for dockerd's config reload, runnable without root: ``python fake_dockerd.py SOCKET CONFIG``.

It serves ``GET /info`` (``Runtimes``, ``DefaultRuntime``) on a unix socket
and re-reads CONFIG on SIGHUP the way dockerd 20.10 does: ``runtimes`` and
``default-runtime`` are replaced when the file has them and **kept** when it
does not. A default naming a runtime that no longer exists is recorded as
``"panic"`` (where dockerd 20.10 crashes at its next reload). SIGUSR1 stands
for a restart: the settings start from scratch, then CONFIG is read.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

state = {"runtimes": {}, "default": "runc"}


def reload(path: str) -> None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return  # dockerd logs the error and keeps its settings
    if "runtimes" in data:
        state["runtimes"] = dict(data["runtimes"])
    if "default-runtime" in data:
        state["default"] = data["default-runtime"]
    if state["default"] != "runc" and state["default"] not in state["runtimes"]:
        state["default"] = "panic"


def restart(path: str) -> None:
    state.update(runtimes={}, default="runc")
    reload(path)


def main() -> int:
    sock_path, config = sys.argv[1], sys.argv[2]
    reload(config)
    signal.signal(signal.SIGHUP, lambda *_: reload(config))
    signal.signal(signal.SIGUSR1, lambda *_: restart(config))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            try:
                serve(conn)
            except OSError:
                pass  # the client went away (e.g. it only wanted SO_PEERCRED)


def serve(conn: socket.socket) -> None:
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(4096)
        if not chunk:
            return
        request += chunk
    if request.startswith(b"GET /info "):
        body = json.dumps({"Runtimes": {"runc": {"path": "runc"}, **state["runtimes"]},
                           "DefaultRuntime": state["default"], "Pid": os.getpid()}).encode()
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
    else:
        conn.sendall(b"HTTP/1.0 404 Not Found\r\n\r\n")


if __name__ == "__main__":
    sys.exit(main())
