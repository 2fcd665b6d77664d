"""Reaching a container engine's daemon: its pid, docker's ``/info``, ``systemctl restart``.

A daemon is found through the socket it serves, never by process name: the
process at the other end of a connection is the one that ``listen()``-ed
(``SO_PEERCRED``). Under systemd socket activation that is systemd itself
(pid 1), which must never get the daemon's SIGHUP; such a pid is refused.
Pids are as this process's pid namespace sees them: in a pod, the installer
needs ``hostPID: true`` (else the peer is outside it and reported as 0).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess

from nvct.base.errors import NvctError

#: struct ucred: pid, uid, gid.
_UCRED = struct.Struct("3i")
SYSTEMCTL_TIMEOUT_S = 300


class DaemonError(NvctError):
    """The daemon could not be found, signalled, asked or restarted."""


class RefusedPid(DaemonError):
    """The socket names a process that must not be signalled (trying again will not help)."""


def peer_credentials(path: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process serving the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as e:
            raise DaemonError(f"{path}: cannot connect: {e.strerror or e}") from None
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


def daemon_pid(socket_path: str, pid_file: str | None = None) -> int:
    """The pid to signal: from ``pid_file`` when given, else the socket's peer."""
    if pid_file:
        try:
            with open(pid_file, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as e:
            raise DaemonError(f"{pid_file}: cannot read the daemon's pid: {e.strerror}") from None
        if not text.isdigit():
            raise DaemonError(f"{pid_file}: does not hold a pid ({text[:40]!r})")
        pid, source = int(text), pid_file
    else:
        pid, source = peer_credentials(socket_path)[0], socket_path
    if pid == 0:
        raise RefusedPid(f"{source}: the daemon is outside this pid namespace "
                          f"(in a pod the installer needs hostPID: true)")
    if pid == 1:
        raise RefusedPid(f"{source}: served by pid 1 (systemd socket activation?): refusing to signal it; "
                          f"use --restart-mode=systemd or --runtime-pid-file")
    if pid == os.getpid():
        raise RefusedPid(f"{source}: served by this very process: refusing to signal it")
    return pid


def docker_info(socket_path: str, timeout: float = 10.0) -> dict:
    """``GET /info`` from dockerd's API socket, as a dict."""
    request = b"GET /info HTTP/1.0\r\nHost: docker\r\nUser-Agent: nvct\r\n\r\n"
    chunks = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            sock.sendall(request)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as e:
            raise DaemonError(f"{socket_path}: docker API: {e.strerror or e}") from None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if status.split(" ")[1:2] != ["200"]:
        raise DaemonError(f"{socket_path}: docker API GET /info: {status or 'no answer'}")
    try:
        info = json.loads(body)
    except ValueError as e:
        raise DaemonError(f"{socket_path}: docker API GET /info: not JSON ({e})") from None
    if not isinstance(info, dict):
        raise DaemonError(f"{socket_path}: docker API GET /info: not a JSON object")
    return info


def systemctl_restart(service: str, host_root: str = "/") -> list[str]:
    """``systemctl restart SERVICE`` on the host (chrooted into ``host_root`` unless it is ``/``)."""
    argv = ["systemctl", "restart", service]
    if os.path.normpath(host_root or "/") != "/":
        argv = ["chroot", host_root] + argv
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=SYSTEMCTL_TIMEOUT_S,
                              check=False)
    except OSError as e:
        raise DaemonError(f"{' '.join(argv)}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise DaemonError(f"{' '.join(argv)}: no answer after {SYSTEMCTL_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise DaemonError(f"{' '.join(argv)}: exit status {proc.returncode}" + (f": {err[-1]}" if err else ""))
    return argv


#: What systemctl says when no systemd runs to answer it (no bus, not booted with systemd).
_NO_SYSTEMD = ("Failed to connect to bus", "has not been booted with systemd", "No such file or directory")


def systemd_reachable(host_root: str, failure: str = "") -> bool:
    """Whether systemd manages the host (sd_booted's test), judged also by systemctl's ``failure``."""
    if any(text in failure for text in _NO_SYSTEMD):
        return False
    return os.path.isdir(os.path.join(host_root or "/", "run/systemd/system"))
