"""Move a CDI spec's paths from one root to another (``nvct cdi transform root``).

A spec generated inside a driver container (driver at ``/run/nvidia/driver``)
or for a host whose driver will live elsewhere is fixed up without
regenerating it. Relative to the *host* (the default), host-side paths move:
device node host paths, mount sources, the paths and arguments of hooks
that run on the host, and the source (``--host-path``) of the in-container
hook's ``bind-mount`` steps. Relative to the *container*, container-side paths move:
device node paths, mount targets, and what createContainer/startContainer
hooks see (a node without a host path gets its old path as one: the host
device does not move). A root matches at a path component boundary only (``/driver``
does not match ``/driver-old``), as in the reference.
"""

from __future__ import annotations

import posixpath

from nvct.edits.model import HOOK_ENV, is_sealed

TYPE_CHECKING = False  # typing costs an import
if TYPE_CHECKING:
    from typing import Any, Callable

RELATIVE_TO = ("host", "container")
_IN_CONTAINER_HOOKS = ("createContainer", "startContainer")
_HOST_FLAG = "--host-path"


def transform_root(raw: dict[str, Any], from_root: str, to_root: str, relative_to: str = "host") -> None:
    """Rewrite ``raw`` (a spec mapping) in place; every hook comes out sealed."""
    if relative_to not in RELATIVE_TO:
        raise ValueError(f"relative_to must be one of {RELATIVE_TO}, not {relative_to!r}")
    _seal_hooks(raw)
    if posixpath.normpath(from_root or "/") == posixpath.normpath(to_root or "/"):
        return
    move = _mover(from_root or "/", to_root or "/")
    edit = _host_edits if relative_to == "host" else _container_edits
    for device in raw.get("devices") or ():
        if device.get("containerEdits"):
            edit(device["containerEdits"], move)
    if raw.get("containerEdits"):
        edit(raw["containerEdits"], move)


def _seal_hooks(raw: dict[str, Any]) -> None:
    """Give every hook without ``env`` nvct's fixed one: the spec we write never lets a
    hook inherit a container's environment (docs/security.md)."""
    for edits in [d.get("containerEdits") or {} for d in raw.get("devices") or ()] + [raw.get("containerEdits") or {}]:
        for hook in edits.get("hooks") or ():
            if not is_sealed(hook):
                hook["env"] = list(HOOK_ENV)


def _mover(root: str, target: str) -> Callable[[str], str]:
    prefix = root if root.endswith("/") else root + "/"

    def move(path: str) -> str:
        if not (path + "/").startswith(prefix):
            return path
        return posixpath.normpath(posixpath.join(target, (path + "/")[len(prefix):]))

    return move


def _host_edits(edits: dict[str, Any], move: Callable[[str], str]) -> None:
    for node in edits.get("deviceNodes") or ():
        host = move(node.get("hostPath") or node["path"])
        if host != node["path"] or node.get("hostPath"):
            node["hostPath"] = host
    for mount in edits.get("mounts") or ():
        mount["hostPath"] = move(mount["hostPath"])
    for hook in edits.get("hooks") or ():
        if hook["hookName"] != "startContainer":
            hook["path"] = move(hook["path"])
        if hook["hookName"] not in _IN_CONTAINER_HOOKS and hook.get("args"):
            hook["args"] = [_move_arg(a, move) for a in hook["args"]]
        elif hook.get("args"):
            hook["args"] = _move_args(hook["args"], move, host=True)


def _container_edits(edits: dict[str, Any], move: Callable[[str], str]) -> None:
    for node in edits.get("deviceNodes") or ():
        path = move(node["path"])
        if path != node["path"] and not node.get("hostPath"):
            node["hostPath"] = node["path"]  # the host device stays where it is
        node["path"] = path
    for mount in edits.get("mounts") or ():
        mount["containerPath"] = move(mount["containerPath"])
    for hook in edits.get("hooks") or ():
        if hook["hookName"] == "startContainer":
            hook["path"] = move(hook["path"])
        if hook["hookName"] in _IN_CONTAINER_HOOKS and hook.get("args"):
            hook["args"] = _move_args(hook["args"], move, host=False)


def _move_args(args: list[str], move: Callable[[str], str], *, host: bool) -> list[str]:
    """An in-container hook's arguments, moving its host paths (``host``) or its container paths.

    Its host paths are the values of ``--host-path`` (the ``bind-mount`` step's
    source); every other path argument is a container path.
    """
    out = []
    for i, arg in enumerate(args):
        if arg.startswith(_HOST_FLAG + "="):
            out.append(_HOST_FLAG + "=" + move(arg[len(_HOST_FLAG) + 1:]) if host else arg)
        elif i > 0 and args[i - 1] == _HOST_FLAG:
            out.append(move(arg) if host else arg)
        else:
            out.append(arg if host else _move_arg(arg, move))
    return out


def _move_arg(arg: str, move: Callable[[str], str]) -> str:
    """An argument that is a path, or ``target::link`` (create-symlinks), moves; others stay."""
    if "::" in arg:
        target, link = arg.split("::", 1)
        return f"{move(target)}::{move(link)}"
    return move(arg)

