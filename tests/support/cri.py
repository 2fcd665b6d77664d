"""A minimal CRI (``runtime.v1``) client: what kubelet does to run one container.

Debian has no crictl; this speaks gRPC to containerd's CRI plugin with
hand-encoded messages (see :mod:`protowire`). Pods use the host network
(``NamespaceMode.NODE``) so no CNI is needed; ``runtime_handler`` picks
``[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.<name>]``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field as dc_field
from typing import Mapping, Sequence

from . import protowire as pw
from .proc import Result, unique_id

_SERVICE = "/runtime.v1.RuntimeService/"
# NamespaceMode
POD, CONTAINER, NODE = 0, 1, 2
STATES = {0: "CREATED", 1: "RUNNING", 2: "EXITED", 3: "UNKNOWN"}
SANDBOX_STATES = {0: "READY", 1: "NOTREADY"}


class CriError(RuntimeError):
    """A CRI call failed; the message is containerd's."""


@dataclass
class PodConfig:
    """A host-network pod; everything a container in it needs to name it again."""

    name: str
    log_directory: str
    namespace: str = "default"
    uid: str = dc_field(default_factory=lambda: unique_id("uid"))
    labels: Mapping[str, str] = dc_field(default_factory=dict)
    annotations: Mapping[str, str] = dc_field(default_factory=dict)
    privileged: bool = False

    def encode(self) -> bytes:
        namespaces = pw.message(pw.field(1, NODE), pw.field(2, CONTAINER), pw.field(3, POD))
        security = pw.message(pw.submessage(1, namespaces), pw.field(6, self.privileged))
        linux = pw.submessage(2, security)
        return pw.message(
            pw.submessage(1, pw.message(pw.field(1, self.name), pw.field(2, self.uid),
                                        pw.field(3, self.namespace))),
            pw.field(3, self.log_directory),
            pw.string_map(6, self.labels),
            pw.string_map(7, self.annotations),
            pw.submessage(8, linux),
        )


@dataclass
class ContainerStatus:
    id: str
    state: str
    exit_code: int
    reason: str
    message: str
    log_path: str
    annotations: dict


class CriClient:
    """Blocking CRI calls over ``unix://<socket>``."""

    def __init__(self, socket: str, *, timeout: float = 60) -> None:
        import grpc  # python3-grpcio; only CRI tests need it

        self.timeout = timeout
        self._rpc_error = grpc.RpcError
        self._channel = grpc.insecure_channel(f"unix://{socket}")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "CriClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request: bytes, timeout: float | None = None) -> dict:
        stub = self._channel.unary_unary(_SERVICE + method)
        try:
            return pw.parse(stub(request, timeout=timeout or self.timeout))
        except self._rpc_error as e:
            raise CriError(f"CRI {method}: {e.code().name}: {e.details()}") from None

    # -- RPCs ------------------------------------------------------------

    def version(self) -> dict:
        fields = self._call("Version", pw.field(1, "v1"), timeout=5)
        return {"version": pw.get_str(fields, 1), "runtime_name": pw.get_str(fields, 2),
                "runtime_version": pw.get_str(fields, 3),
                "runtime_api_version": pw.get_str(fields, 4)}

    def wait_ready(self, timeout: float = 30) -> dict:
        """Wait until the CRI plugin answers (it starts after containerd's socket)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.version()
            except CriError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def run_pod_sandbox(self, pod: PodConfig, runtime_handler: str = "") -> str:
        fields = self._call("RunPodSandbox", pw.message(pw.submessage(1, pod.encode()),
                                                         pw.field(2, runtime_handler)))
        return pw.get_str(fields, 1)

    def create_container(self, pod_id: str, pod: PodConfig, name: str, image: str, *,
                         command: Sequence[str] = (), args: Sequence[str] = (),
                         env: Mapping[str, str] | None = None,
                         annotations: Mapping[str, str] | None = None,
                         labels: Mapping[str, str] | None = None,
                         log_path: str | None = None,
                         devices: Sequence[tuple[str, str, str]] = (),
                         mounts: Sequence[tuple[str, str, bool]] = (),
                         privileged: bool = False) -> str:
        """Create ``name`` in the pod; ``devices``: (container, host, perms); ``mounts``: (container, host, ro)."""
        namespaces = pw.message(pw.field(1, NODE), pw.field(2, CONTAINER), pw.field(3, POD))
        security = pw.message(pw.field(2, privileged), pw.submessage(3, namespaces))
        config = pw.message(
            pw.submessage(1, pw.field(1, name)),
            pw.submessage(2, pw.field(1, image)),
            pw.repeated(3, command),
            pw.repeated(4, args),
            b"".join(pw.submessage(6, pw.field(1, k) + pw.field(2, v))
                     for k, v in (env or {}).items()),
            b"".join(pw.submessage(7, pw.message(pw.field(1, c), pw.field(2, h), pw.field(3, ro)))
                     for c, h, ro in mounts),
            b"".join(pw.submessage(8, pw.message(pw.field(1, c), pw.field(2, h), pw.field(3, p)))
                     for c, h, p in devices),
            pw.string_map(9, labels),
            pw.string_map(10, annotations),
            pw.field(11, log_path or f"{name}.log"),
            pw.submessage(15, pw.submessage(2, security)),
        )
        fields = self._call("CreateContainer", pw.message(
            pw.field(1, pod_id), pw.submessage(2, config), pw.submessage(3, pod.encode())))
        return pw.get_str(fields, 1)

    def start_container(self, container_id: str) -> None:
        self._call("StartContainer", pw.field(1, container_id))

    def container_status(self, container_id: str) -> ContainerStatus:
        status = pw.get_msg(self._call("ContainerStatus", pw.field(1, container_id)), 1)
        return ContainerStatus(
            id=pw.get_str(status, 1), state=STATES.get(pw.get_int(status, 3), "UNKNOWN"),
            exit_code=pw.get_int(status, 7), reason=pw.get_str(status, 10),
            message=pw.get_str(status, 11), log_path=pw.get_str(status, 15),
            annotations=pw.get_map(status, 13))

    def wait_exited(self, container_id: str, timeout: float = 60) -> ContainerStatus | None:
        deadline = time.monotonic() + timeout
        while True:
            status = self.container_status(container_id)
            if status.state == "EXITED":
                return status
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        self._call("StopContainer", pw.field(1, container_id) + pw.field(2, timeout))

    def remove_container(self, container_id: str) -> None:
        self._call("RemoveContainer", pw.field(1, container_id))

    def stop_pod_sandbox(self, pod_id: str) -> None:
        self._call("StopPodSandbox", pw.field(1, pod_id))

    def remove_pod_sandbox(self, pod_id: str) -> None:
        self._call("RemovePodSandbox", pw.field(1, pod_id))

    def list_pod_sandboxes(self) -> list[dict]:
        items = self._call("ListPodSandbox", b"").get(1, [])
        out = []
        for raw in items:
            item = pw.parse(raw)
            out.append({"id": pw.get_str(item, 1),
                        "name": pw.get_str(pw.get_msg(item, 2), 1),
                        "state": SANDBOX_STATES.get(pw.get_int(item, 3), "UNKNOWN"),
                        "runtime_handler": pw.get_str(item, 7)})
        return out

    def remove_all_pods(self) -> None:
        for pod in self.list_pod_sandboxes():
            self.stop_pod_sandbox(pod["id"])
            self.remove_pod_sandbox(pod["id"])

    # -- the kubelet dance ------------------------------------------------

    def run_once(self, image: str, command: Sequence[str], *, log_directory: str,
                 runtime_handler: str = "", env: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None,
                 pod_annotations: Mapping[str, str] | None = None,
                 devices: Sequence[tuple[str, str, str]] = (),
                 privileged: bool = False, timeout: float = 60) -> Result:
        """Pod + one container running ``command``; output from its CRI log.

        The pod is always torn down. ``rc`` is the container's exit code;
        a failing RPC gives rc -1 and the error in ``stderr``.
        """
        start = time.monotonic()
        result = self._run_once(image, command, log_directory=log_directory,
                                runtime_handler=runtime_handler, env=env,
                                annotations=annotations, pod_annotations=pod_annotations,
                                devices=devices, privileged=privileged, timeout=timeout)
        result.duration = time.monotonic() - start
        return result

    def _run_once(self, image, command, *, log_directory, runtime_handler, env,
                  annotations, pod_annotations, devices, privileged, timeout) -> Result:
        os.makedirs(log_directory, exist_ok=True)
        pod = PodConfig(name=unique_id("pod"), log_directory=log_directory,
                        annotations=dict(pod_annotations or {}), privileged=privileged)
        timings: dict[str, float] = {}
        pod_id = None
        t_all = time.monotonic()
        try:
            t0 = time.monotonic()
            pod_id = self.run_pod_sandbox(pod, runtime_handler)
            timings["run_pod"] = time.monotonic() - t0
            t0 = time.monotonic()
            cid = self.create_container(pod_id, pod, "app", image, command=command,
                                        env=env, annotations=annotations,
                                        log_path="app.log", devices=devices,
                                        privileged=privileged)
            timings["create"] = time.monotonic() - t0
            t0 = time.monotonic()
            self.start_container(cid)
            timings["start"] = time.monotonic() - t0
            t0 = time.monotonic()
            status = self.wait_exited(cid, timeout)
            timings["wait"] = time.monotonic() - t0
            stdout, stderr = read_cri_log(os.path.join(log_directory, "app.log"))
            if status is None:
                return Result(rc=-1, stdout=stdout, stderr=stderr, argv=list(command),
                              timings=timings, timed_out=True)
            if status.message:
                stderr += status.message
            return Result(rc=status.exit_code, stdout=stdout, stderr=stderr,
                          argv=list(command), timings=timings)
        except CriError as e:
            return Result(rc=-1, stdout="", stderr=str(e), argv=list(command), timings=timings)
        finally:
            if pod_id:
                t0 = time.monotonic()
                self.stop_pod_sandbox(pod_id)
                self.remove_pod_sandbox(pod_id)
                timings["teardown"] = time.monotonic() - t0
            timings["total"] = time.monotonic() - t_all


def read_cri_log(path: str) -> tuple[str, str]:
    """(stdout, stderr) from a CRI log: ``<RFC3339Nano> <stdout|stderr> <F|P> <message>``."""
    streams = {"stdout": [], "stderr": []}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split(" ", 3)
                if len(parts) < 3 or parts[1] not in streams:
                    continue
                text = parts[3] if len(parts) == 4 else ""
                streams[parts[1]].append(text if parts[2] == "P" else text + "\n")
    except FileNotFoundError:
        pass
    return "".join(streams["stdout"]), "".join(streams["stderr"])
