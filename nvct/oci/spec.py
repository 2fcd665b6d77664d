"""Read, edit and write an OCI bundle's config.json.

The spec is kept as the plain JSON mapping it was read as, so fields nvct
does not know survive untouched, and it is replaced atomically. Edits are
applied with CDI's semantics: a device node also gets a device-cgroup allow
rule, a mount or node replaces one at the same path, env is merged so no
variable appears twice.
"""

from __future__ import annotations

import os

from nvct.base.errors import SpecError

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

#: Hook executables that mark a spec as already handled by an NVIDIA hook.
NVIDIA_HOOK_NAMES = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")


def config_path(bundle: str) -> str:
    return os.path.join(bundle, "config.json")


def read_raw(bundle: str) -> bytes:
    path = config_path(bundle)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise SpecError(f"{path}: OCI spec not found") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read OCI spec: {e.strerror}") from None


def load(bundle: str, raw: bytes | None = None) -> dict[str, Any]:
    """The spec as a JSON mapping (``raw``: its bytes, when already read)."""
    from nvct.base import jsoncodec

    path = config_path(bundle)
    if raw is None:
        raw = read_raw(bundle)
    try:
        spec = jsoncodec.loads(raw)
    except ValueError as e:
        raise SpecError(f"{path}: cannot read OCI spec: {e}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path}: OCI spec is not a JSON object")
    problem = shape_problem(spec)
    if problem:
        raise SpecError(f"{path}: {problem}")
    return spec


#: The fields nvct reads or writes, and the JSON type each must have (None: any).
_SHAPE: tuple[tuple[str, type | tuple[type, ...], type | tuple[type, ...] | None], ...] = (
    ("process", dict, None),
    ("process.env", list, str),
    ("process.capabilities", (dict, list), None),
    ("process.capabilities.bounding", list, str),
    ("process.user", dict, None),
    ("process.user.uid", int, None),
    ("process.user.gid", int, None),
    ("root", dict, None),
    ("root.path", str, None),
    ("mounts", list, dict),
    ("annotations", dict, str),
    ("hooks", dict, list),
    ("linux", dict, None),
    ("linux.devices", list, dict),
    ("linux.resources", dict, None),
    ("linux.resources.devices", list, dict),
)
_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a number"}
_PLURAL: dict[Any, str] = {dict: "objects", list: "arrays", str: "strings"}


def shape_problem(spec: dict[str, Any]) -> str | None:
    """Why ``spec`` cannot be read (a field of the wrong JSON type), or None.

    Checked once on load, so later code can rely on the types and a bad
    spec gets one line naming the field, never an internal error.
    """
    for name, kind, item in _SHAPE:
        value: Any = spec
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
            if value is None:
                break
        if value is None:
            continue
        if not isinstance(value, kind):
            return f"{name} must be {_kind_name(kind)}, not {_json_type(value)}"
        if item is None:
            continue
        values: Any = value.values() if isinstance(value, dict) else value
        for v in values:
            if not isinstance(v, item):
                return f"{name} must hold only {_PLURAL[item]}, not {_json_type(v)}"
    for i, m in enumerate(spec.get("mounts") or ()):
        for key in ("destination", "source", "type"):
            if m.get(key) is not None and not isinstance(m[key], str):
                return f"mounts[{i}].{key} must be a string, not {_json_type(m[key])}"
        options = m.get("options")
        if options is not None and not (isinstance(options, list)
                                        and all(isinstance(o, str) for o in options)):
            return f"mounts[{i}].options must be an array of strings"
    return None


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return _JSON_NAMES.get(type(value), type(value).__name__)


def save(bundle: str, spec: dict[str, Any]) -> None:
    from nvct.base import jsoncodec
    from nvct.base.fileutil import write_atomic

    write_atomic(config_path(bundle), jsoncodec.dumps(spec, compact=True), durable=False)


def rootfs(spec: dict[str, Any], bundle: str) -> str:
    """The absolute root filesystem path (root.path may be relative to the bundle)."""
    root = (spec.get("root") or {}).get("path")
    if not root:
        raise SpecError(f"{config_path(bundle)}: root.path is missing")
    return root_path(root, bundle)


def root_path(root: str, bundle: str | None) -> str:
    """``root`` as runc resolves it: a relative one joined to the bundle's real path, then cleaned.

    runc joins it to its working directory, the bundle as getcwd(3) shows it
    (no symlinks), and refuses the result unless it names no symlink itself;
    :func:`nvct.rootfs.root.open_root` applies that rule.
    """
    if not root.startswith("/"):
        root = os.path.join(os.path.realpath(bundle or "."), root)
    return "/" + os.path.normpath(root).lstrip("/")


def root_owners(spec: dict[str, Any]) -> tuple[int, ...]:
    """The host uid the spec maps to the container's root (a user namespace), if any.

    An engine that remaps users owns the root as that uid (docker's
    userns-remap, podman's ``--userns``); see :func:`nvct.rootfs.root.open_root`.
    """
    maps = (spec.get("linux") or {}).get("uidMappings")  # linux: an object (shape_problem)
    out = []
    for m in maps if isinstance(maps, list) else ():
        if isinstance(m, dict) and all(isinstance(m.get(k), int) and not isinstance(m.get(k), bool)
                                       for k in ("containerID", "hostID", "size")):
            if m["containerID"] <= 0 < m["containerID"] + m["size"]:
                out.append(m["hostID"] - m["containerID"])
    return tuple(out)


def merge_env(env: list[str], extra: list[str]) -> list[str]:
    """``extra`` overrides ``env`` by name; each name appears once, in first-seen order."""
    merged: dict[str, str] = {}
    for item in list(env) + list(extra):
        merged[item.partition("=")[0]] = item
    return list(merged.values())


def has_nvidia_hook(spec: dict[str, Any]) -> bool:
    return any(_is_nvidia_hook(h) for h in (spec.get("hooks") or {}).get("prestart") or ())


def remove_nvidia_hooks(spec: dict[str, Any]) -> int:
    """Drop NVIDIA prestart hooks (cdi and jit-cdi modes do their work without them)."""
    hooks = spec.get("hooks") or {}
    prestart = hooks.get("prestart") or []
    kept = [h for h in prestart if not _is_nvidia_hook(h)]
    removed = len(prestart) - len(kept)
    if removed:
        if kept:
            hooks["prestart"] = kept
        else:
            del hooks["prestart"]
    return removed


def _is_nvidia_hook(hook: Any) -> bool:
    return isinstance(hook, dict) and os.path.basename(str(hook.get("path", ""))) in NVIDIA_HOOK_NAMES
