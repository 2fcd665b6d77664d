"""Container edits written into an OCI spec, as a CDI-aware runtime would write them (the shim's path)."""

from __future__ import annotations

import os

from nvct.oci import spec as ocispec

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

    from nvct.edits.model import Chain, ContainerEdits, DeviceNode, Hook, Mount


def apply_edits(spec: dict[str, Any], edits: ContainerEdits) -> None:
    """Write ``edits`` into ``spec`` the way a CDI-aware runtime would."""
    if edits.env:
        process = spec.setdefault("process", {})
        process["env"] = ocispec.merge_env(process.get("env") or [], edits.env)
    for node in edits.device_nodes:
        _add_device(spec, node)
    if edits.mounts:
        from nvct.edits.model import writable_last

        mounts = spec.get("mounts") or []
        targets = {m.container_path for m in edits.mounts}
        mounts = [m for m in mounts if os.path.normpath(m.get("destination", "")) not in targets]
        mounts.extend(_oci_mount(m) for m in writable_last(edits.mounts))
        spec["mounts"] = mounts
    for hook in edits.hooks:
        add_hook(spec, hook)
    if edits.additional_gids:
        user = spec.setdefault("process", {}).setdefault("user", {})
        gids = list(user.get("additionalGids") or [])
        for gid in edits.additional_gids:
            if gid not in gids:
                gids.append(gid)
        user["additionalGids"] = gids
    if edits.net_devices:
        net = spec.setdefault("linux", {}).setdefault("netDevices", {})
        for dev in edits.net_devices:
            net[dev.host_interface_name] = {"name": dev.name}
    if edits.intel_rdt is not None:
        spec.setdefault("linux", {})["intelRdt"] = edits.intel_rdt.to_cdi()


def add_hook(spec: dict[str, Any], hook: Hook | Chain, *, first: bool = False) -> None:
    entry = hook_entry(hook)
    hooks = spec["hooks"] = spec.get("hooks") or {}  # null is JSON's "none" too
    stage = hooks[hook.hook_name] = hooks.get(hook.hook_name) or []
    if first:
        stage.insert(0, entry)
    else:
        stage.append(entry)


def hook_entry(hook: Hook | Chain) -> dict[str, Any]:
    """``hook`` as an entry of the spec's ``hooks.<stage>`` list."""
    entry = hook.to_cdi()  # CDI's hook is OCI's plus the stage name
    del entry["hookName"]
    return entry


def _add_device(spec: dict[str, Any], node: DeviceNode) -> None:
    linux = spec.setdefault("linux", {})
    entry: dict[str, Any] = {"path": node.path, "type": node.type, "major": node.major, "minor": node.minor}
    if node.file_mode is not None:
        entry["fileMode"] = node.file_mode
    # As CDI: a node without an owner belongs to the container's user, when not root.
    user = (spec.get("process") or {}).get("user") or {}
    uid = node.uid if node.uid is not None else (user.get("uid") or None)
    gid = node.gid if node.gid is not None else (user.get("gid") or None)
    if uid is not None:
        entry["uid"] = uid
    if gid is not None:
        entry["gid"] = gid
    devices = [d for d in linux.get("devices") or [] if d.get("path") != node.path]
    devices.append(entry)
    linux["devices"] = devices
    allow_device(spec, node)


def allow_device(spec: dict[str, Any], node: DeviceNode) -> None:
    """``node``'s allow rule in ``linux.resources.devices`` (legacy mode: the hook makes the node)."""
    if node.type not in ("b", "c"):
        return  # as CDI: cgroup rules for block and char devices only
    linux = spec["linux"] = spec.get("linux") or {}  # null is JSON's "none" too
    resources = linux["resources"] = linux.get("resources") or {}
    rules = resources["devices"] = resources.get("devices") or []
    rule = {"allow": True, "type": node.type, "major": node.major, "minor": node.minor,
            "access": _access(node.permissions)}
    if rule not in rules:
        rules.append(rule)


def _oci_mount(m: Mount) -> dict[str, Any]:
    out: dict[str, Any] = {"destination": m.container_path, "type": m.type or "bind", "source": m.host_path}
    if m.options:
        out["options"] = list(m.options)
    return out


def _access(permissions: str) -> str:
    # CDI: empty means "rwm", "none" an empty access string.
    if permissions == "none":
        return ""
    return permissions or "rwm"
