"""The NRI messages the plugin uses (containerd/nri ``pkg/api/api.proto``, package ``nri.pkg.api.v1alpha1``).

Only the fields read or written here are known; field numbers are the proto's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvct.nri import wire

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
#: api.proto's Event enum value; a plugin subscribes with the mask bit ``1 << (event - 1)``.
CREATE_CONTAINER = 4


def event_mask(*events: int) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


def register_plugin_request(name: str, index: str) -> bytes:
    """RegisterPluginRequest{plugin_name = 1, plugin_idx = 2}."""
    return wire.string(1, name) + wire.string(2, index)


@dataclass(frozen=True)
class Configure:
    """ConfigureRequest{config = 1, runtime_name = 2, runtime_version = 3}."""

    runtime_name: str
    runtime_version: str

    @classmethod
    def decode(cls, data: bytes) -> "Configure":
        f = wire.parse(data)
        return cls(wire.get_str(f, 2), wire.get_str(f, 3))


def configure_response(events: int) -> bytes:
    """ConfigureResponse{events = 2}."""
    return wire.uint(2, events)


def synchronize_more(data: bytes) -> bool:
    """SynchronizeRequest.more (3): the runtime sends more pods and containers in another call."""
    return bool(wire.get_int(wire.parse(data), 3))


def synchronize_response(more: bool) -> bytes:
    """SynchronizeResponse{update = 1, more = 2}: no updates."""
    return wire.uint(2, int(more))


@dataclass(frozen=True)
class Pod:
    """PodSandbox{id = 1, name = 2, uid = 3, namespace = 4, annotations = 6}."""

    id: str = ""
    name: str = ""
    namespace: str = ""
    annotations: dict = field(default_factory=dict)

    @classmethod
    def from_fields(cls, f: dict) -> "Pod":
        return cls(wire.get_str(f, 1), wire.get_str(f, 2), wire.get_str(f, 4), wire.get_map(f, 6))


@dataclass(frozen=True)
class Container:
    """Container{id = 1, pod_sandbox_id = 2, name = 3}."""

    id: str = ""
    name: str = ""

    @classmethod
    def from_fields(cls, f: dict) -> "Container":
        return cls(wire.get_str(f, 1), wire.get_str(f, 3))


def create_container_request(data: bytes) -> tuple[Pod, Container]:
    """CreateContainerRequest{pod = 1, container = 2}."""
    f = wire.parse(data)
    return Pod.from_fields(wire.get_msg(f, 1)), Container.from_fields(wire.get_msg(f, 2))


def create_container_response(cdi_devices: list[str]) -> bytes:
    """CreateContainerResponse{adjust = 1}: ContainerAdjustment{CDI_devices = 8}, CDIDevice{name = 1}."""
    if not cdi_devices:
        return b""
    adjust = b"".join(wire.message(8, wire.string(1, name)) for name in cdi_devices)
    return wire.message(1, adjust)
