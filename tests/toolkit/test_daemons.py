"""Finding a daemon through its socket, asking docker's API, restarting through systemctl."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from nvct.toolkit import daemons
from nvct.toolkit.daemons import DaemonError

SERVE = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(4)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


@pytest.fixture
def served_socket(tmp_path):
    """A unix socket listened on by a child process: (path, child)."""
    path = str(tmp_path / "daemon.sock")
    child = subprocess.Popen([sys.executable, "-c", SERVE, path], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ready\n"
    yield path, child
    child.kill()
    child.wait()


def test_peer_credentials_name_the_process_serving_the_socket(served_socket):
    path, child = served_socket
    assert daemons.peer_credentials(path) == (child.pid, os.getuid(), os.getgid())
    assert daemons.daemon_pid(path) == child.pid


def test_a_pid_file_overrides_the_socket(tmp_path):
    pid_file = tmp_path / "dockerd.pid"
    pid_file.write_text("4242\n")
    assert daemons.daemon_pid(str(tmp_path / "no.sock"), str(pid_file)) == 4242


@pytest.mark.parametrize("content, message", [("", "does not hold a pid"), ("abc", "does not hold a pid")])
def test_a_bad_pid_file_is_named(tmp_path, content, message):
    pid_file = tmp_path / "dockerd.pid"
    pid_file.write_text(content)
    with pytest.raises(DaemonError, match=f"{pid_file}: {message}"):
        daemons.daemon_pid("/nonexistent.sock", str(pid_file))


def test_a_socket_nobody_serves_is_named(tmp_path):
    with pytest.raises(DaemonError, match=f"{tmp_path}/none.sock: cannot connect"):
        daemons.daemon_pid(str(tmp_path / "none.sock"))


@pytest.mark.parametrize("pid, message", [
    (1, "served by pid 1 \\(systemd socket activation\\?\\): refusing to signal it"),
    (0, "outside this pid namespace \\(in a pod the installer needs hostPID: true\\)"),
])
def test_pids_that_must_never_be_signalled_are_refused(monkeypatch, pid, message):
    monkeypatch.setattr(daemons, "peer_credentials", lambda path: (pid, 0, 0))
    with pytest.raises(daemons.RefusedPid, match=message):
        daemons.daemon_pid("/run/docker.sock")


def test_our_own_pid_is_refused(monkeypatch):
    monkeypatch.setattr(daemons, "peer_credentials", lambda path: (os.getpid(), 0, 0))
    with pytest.raises(DaemonError, match="served by this very process"):
        daemons.daemon_pid("/run/docker.sock")


def _http_server(path: str, response: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        with conn, server:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            assert data.startswith(b"GET /info HTTP/1.0\r\n")
            conn.sendall(response)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_docker_info_reads_the_json_body(tmp_path):
    path = str(tmp_path / "docker.sock")
    body = json.dumps({"Runtimes": {"runc": {}, "nvidia": {}}, "DefaultRuntime": "nvidia"}).encode()
    thread = _http_server(path, b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
    assert daemons.docker_info(path) == {"Runtimes": {"runc": {}, "nvidia": {}}, "DefaultRuntime": "nvidia"}
    thread.join(5)


@pytest.mark.parametrize("response, message", [
    (b"HTTP/1.0 500 Internal Server Error\r\n\r\noops", "GET /info: HTTP/1.0 500 Internal Server Error"),
    (b"HTTP/1.0 200 OK\r\n\r\nnot json", "GET /info: not JSON"),
    (b"HTTP/1.0 200 OK\r\n\r\n[1]", "GET /info: not a JSON object"),
])
def test_docker_info_errors_say_what_came_back(tmp_path, response, message):
    path = str(tmp_path / "docker.sock")
    thread = _http_server(path, response)
    with pytest.raises(DaemonError, match=message):
        daemons.docker_info(path)
    thread.join(5)


def test_systemctl_restart_runs_systemctl_on_this_host(fake_systemctl):
    assert daemons.systemctl_restart("crio", "/") == ["systemctl", "restart", "crio"]
    assert fake_systemctl.read_text() == "restart crio\n"


def test_systemctl_failure_names_the_command_and_its_error(fake_systemctl):
    with pytest.raises(DaemonError, match="systemctl restart broken: exit status 5: Unit broken.service not found."):
        daemons.systemctl_restart("broken", "/")


def test_systemctl_restart_chroots_into_the_host_root(monkeypatch):
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert daemons.systemctl_restart("containerd", "/host") == ["chroot", "/host", "systemctl", "restart",
                                                                "containerd"]
    assert calls == [["chroot", "/host", "systemctl", "restart", "containerd"]]
