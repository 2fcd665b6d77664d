"""nvct's NRI plugin: the CDI devices a pod's annotation names, for the GPU Operator's NRI mode.

The contract is the reference installer's: the pod annotation
``nvidia.cdi.k8s.io/container.<name>`` (else ``nvidia.cdi.k8s.io/pod``, else
``nvidia.cdi.k8s.io``) holds comma-separated fully qualified CDI device names;
the container ``<name>`` gets exactly those, resolved by the runtime in its
CDI spec directories. A value naming ``management.nvidia.com/gpu`` is honoured
only in the allowed namespaces (``NRI_NAMESPACE`` and
``NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES``); elsewhere the container gets
nothing from the annotation at all. When the runtime goes away (a containerd
restart) the plugin registers again, every 2 seconds until it can.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Callable, Iterable, Sequence

from nvct.base.errors import NvctError
from nvct.nri import messages as m, ttrpc, wire

ANNOTATION_DOMAIN = "nvidia.cdi.k8s.io"
MANAGEMENT_KIND = "management.nvidia.com/gpu"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_INDEX = 10
#: The name registered when the program's own is unknown (the reference registers under its program's name).
PLUGIN_NAME = "nvidia-ctk-installer"
RECONNECT_S = 2.0
#: How long the first registration may take before the installer gives up.
REGISTER_TIMEOUT_S = 15.0
_REGISTER_STREAM = 1


class NriError(NvctError):
    """The plugin could not register with the runtime."""


def effective_annotation(annotations: dict, container: str) -> str | None:
    """The container-scoped annotation, else the pod-scoped one, else the bare key (NRI's rule)."""
    for key in (f"{ANNOTATION_DOMAIN}/container.{container}", f"{ANNOTATION_DOMAIN}/pod", ANNOTATION_DOMAIN):
        if key in annotations:
            return annotations[key]
    return None


class Policy:
    """Which CDI devices a container gets: the annotation's, with management devices only in ``namespaces``."""

    def __init__(self, namespaces: Iterable[str]) -> None:
        self.namespaces = [n for n in namespaces if n]

    def devices(self, pod: m.Pod, container: str) -> tuple[list[str], str]:
        """(device names, why: a line for the log)."""
        value = effective_annotation(pod.annotations, container)
        if value is None:
            return [], "no CDI devices annotated"
        if MANAGEMENT_KIND in value.lower() and pod.namespace not in self.namespaces:
            return [], (f"requests management CDI devices ({value}) outside the allowed namespaces "
                        f"({', '.join(self.namespaces) or 'none'}): none injected")
        names = [name.strip() for name in value.split(",") if name.strip()]
        return names, f"injecting CDI devices {', '.join(names)}" if names else "an empty CDI device annotation"


class Plugin:
    """``Plugin(socket, "10", policy, log).start()``; later ``.stop()``."""

    def __init__(self, socket_path: str, index: str, policy: Policy, log: Callable[[str], None],
                 name: str = PLUGIN_NAME, reconnect_s: float = RECONNECT_S) -> None:
        self.socket_path = socket_path
        self.index = index
        self.policy = policy
        self.log = log
        self.name = name
        self.reconnect_s = reconnect_s
        #: Set on each successful registration (tests and the first start wait on it).
        self.registered = threading.Event()
        self.registrations = 0
        self._stopped = threading.Event()
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- life ---
    def start(self, block_signals: Sequence[int] = (), timeout: float = REGISTER_TIMEOUT_S) -> "Plugin":
        """Register (or fail with one line); then serve, and re-register, in a thread.

        ``block_signals`` stay blocked in that thread, so that they reach the
        thread that ``sigwait``-s for them.
        """
        if not os.path.exists(self.socket_path):
            raise NriError(f"NRI socket {self.socket_path}: not found (is NRI enabled in the container runtime? "
                           f"containerd: [plugins.\"io.containerd.nri.v1.nri\"] disable = false)")
        first = self._connect()  # raises NriError
        old = signal.pthread_sigmask(signal.SIG_BLOCK, block_signals) if block_signals else None
        try:
            self._thread = threading.Thread(target=self._run, args=(first,), name="nvct-nri", daemon=True)
            self._thread.start()
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if not self.registered.wait(timeout):
            self.stop()
            raise NriError(f"NRI socket {self.socket_path}: the runtime did not accept the plugin "
                           f"{self.index}-{self.name} within {timeout:.0f}s")
        return self

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise NriError(f"NRI socket {self.socket_path}: cannot connect: {e.strerror or e}") from None
        return sock

    def _run(self, sock: socket.socket | None) -> None:
        while not self._stopped.is_set():
            if sock is None:
                try:
                    sock = self._connect()
                except NriError:
                    self._stopped.wait(self.reconnect_s)
                    continue
            with self._lock:
                self._sock = sock
            if self._stopped.is_set():  # stop() came before the socket was visible to it
                sock.close()
                return
            try:
                self._serve(sock)
            except (OSError, ttrpc.ProtocolError, wire.WireError, NriError) as e:
                if not self._stopped.is_set():
                    self.log(f"NRI: connection to {self.socket_path} failed: {e}")
            finally:
                with self._lock:
                    self._sock = None
                sock.close()
                sock = None
            if not self._stopped.is_set():
                self.log(f"NRI: connection to {self.socket_path} is down; reconnecting every {self.reconnect_s:g}s")
                self._stopped.wait(self.reconnect_s)

    # --- one connection ---
    def _serve(self, sock: socket.socket) -> None:
        register = ttrpc.Request(m.RUNTIME_SERVICE, "RegisterPlugin", m.register_plugin_request(self.name, self.index))
        sock.sendall(ttrpc.mux_frame(ttrpc.RUNTIME_CONN,
                                     ttrpc.message(_REGISTER_STREAM, ttrpc.REQUEST, register.encode())))
        demux = ttrpc.Demux()
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return
            for conn, msg in demux.feed(data):
                if conn == ttrpc.RUNTIME_CONN and msg.type == ttrpc.RESPONSE and msg.stream_id == _REGISTER_STREAM:
                    answer = ttrpc.Response.decode(msg.payload)
                    if answer.code != ttrpc.OK:
                        raise NriError(f"the runtime refused plugin {self.index}-{self.name}: {answer.message}")
                    self.registrations += 1
                    self.log(f"NRI: registered as {self.index}-{self.name} with {self.socket_path}")
                    self.registered.set()
                elif conn == ttrpc.PLUGIN_CONN and msg.type == ttrpc.REQUEST:
                    reply = self._answer(ttrpc.Request.decode(msg.payload))
                    sock.sendall(ttrpc.mux_frame(ttrpc.PLUGIN_CONN,
                                                 ttrpc.message(msg.stream_id, ttrpc.RESPONSE, reply.encode())))

    def _answer(self, request: ttrpc.Request) -> ttrpc.Response:
        if request.service != m.PLUGIN_SERVICE:
            return ttrpc.Response(ttrpc.UNIMPLEMENTED, f"service {request.service} is not served here")
        try:
            return ttrpc.Response(payload=self.handle(request.method, request.payload))
        except wire.WireError as e:
            return ttrpc.Response(ttrpc.INTERNAL, f"{request.method}: cannot decode the request: {e}")

    def handle(self, method: str, payload: bytes) -> bytes:
        """The reply's payload for one call of the Plugin service."""
        if method == "Configure":
            configure = m.Configure.decode(payload)
            self.log(f"NRI: configured by {configure.runtime_name} {configure.runtime_version}")
            return m.configure_response(m.event_mask(m.CREATE_CONTAINER))
        if method == "Synchronize":
            return m.synchronize_response(m.synchronize_more(payload))
        if method == "CreateContainer":
            pod, container = m.create_container_request(payload)
            devices, why = self.policy.devices(pod, container.name)
            if pod.annotations and why != "no CDI devices annotated":
                self.log(f"NRI: {pod.namespace}/{pod.name}/{container.name}: {why}")
            return m.create_container_response(devices)
        return b""  # Shutdown, StateChange and the events not subscribed to: an empty reply
