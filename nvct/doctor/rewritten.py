"""A bundle nvct's shim has already rewritten: the spec as the engine passed it, for ``nvct explain``."""

from __future__ import annotations

import copy

from nvct.base.errors import NvctError
from nvct.cdi import modes as cdi_modes
from nvct.cdi.features import for_jit
from nvct.discover.driver import Driver
from nvct.edits import build as injection, sandbox
from nvct.edits.model import ContainerEdits, Hook, as_chain
from nvct.edits.steps import MaskParams
from nvct.modifier import modes
from nvct.modifier.modes import GPU_REQUEST_ENV
from nvct.oci import spec as ocispec
from nvct.request import container as request_mod
from nvct.request.container import VISIBLE_DEVICES


def unrewrite(spec: dict, config, *, bundle: str | None = None, driver=None) -> tuple[dict, list[str]]:
    """``spec`` as the engine passed it, when nvct's shim has already rewritten it; and what was found.

    A running container's config.json is the shim's output: jit-cdi and cdi
    mode replace NVIDIA_VISIBLE_DEVICES by ``void`` (so no hook injects twice)
    and add nodes, mounts, the params-mask hook and the bundle's params file;
    legacy mode adds its prestart hook. Explaining that as a request says "no
    GPU requested". Here nvct's hooks are taken out, and a ``void`` that nvct
    set is replaced by the request whose edits the spec holds: of the
    candidates (the GPUs and MIG devices among its device nodes, by index or as
    CDI names, ``all``, or none in env), the one whose edits the spec contains,
    the largest. ``(spec, [])`` when the spec was not rewritten.
    """
    spec = copy.deepcopy(spec)
    notes = _drop_legacy_hooks(spec)
    env = (spec.get("process") or {}).get("env") or []
    if f"{VISIBLE_DEVICES}=void" not in env or not _jit_marks(spec, bundle, notes):
        return spec, notes

    driver = driver or Driver.from_config(config)
    devices = {d.get("path") for d in (spec.get("linux") or {}).get("devices") or ()}
    targets = {m.get("destination") for m in spec.get("mounts") or ()}
    base = copy.deepcopy(spec)
    base["process"]["env"] = [e for e in env if e != f"{VISIBLE_DEVICES}=void"]
    best = None
    for value in _candidates(driver, devices, config.mode == "cdi"):
        trial = copy.deepcopy(base)
        if value is not None:
            trial["process"]["env"] = ocispec.merge_env(trial["process"]["env"], [f"{VISIBLE_DEVICES}={value}"])
        edits = edits_of(trial, config, driver)
        if edits is None:
            continue
        nodes = {n.path for n in edits.device_nodes}
        mounts = {m.container_path for m in edits.mounts}
        if nodes <= devices and mounts <= targets and (best is None or len(nodes) + len(mounts) > best[0]):
            best = (len(nodes) + len(mounts), value, trial, edits)
    if best is None:
        notes.append(f"{VISIBLE_DEVICES}=void, set by nvct's shim; no request gives the edits this spec "
                     "holds (the node or config changed since), so none is assumed")
        return base, notes
    _, value, trial, edits = best
    _drop_edits(trial, edits)
    shown = f"{VISIBLE_DEVICES}={value}" if value is not None else f"{VISIBLE_DEVICES} unset"
    notes.append(f"{VISIBLE_DEVICES}=void, set by nvct's shim; the request whose edits this spec holds: {shown}")
    notes.append(f"{len(edits.device_nodes)} device node(s) and {len(edits.mounts)} mount(s) the shim added, "
                 "taken out")
    return trial, notes


def _drop_legacy_hooks(spec: dict) -> list[str]:
    """Take out legacy mode's prestart hook (its env carries nvct's marker)."""
    hooks = spec.get("hooks") or {}
    kept = [h for h in hooks.get("prestart") or () if f"{GPU_REQUEST_ENV}=1" not in (h.get("env") or ())]
    if len(kept) == len(hooks.get("prestart") or ()):
        return []
    hooks["prestart"] = kept
    return [f"legacy mode's prestart hook, inserted by nvct's shim ({GPU_REQUEST_ENV}=1 in its env), taken out"]


def _jit_marks(spec: dict, bundle: str | None, notes: list[str]) -> bool:
    """Take out the params-mask hook jit-cdi and cdi mode add; whether anything of theirs was found."""
    found = False
    hooks = spec.get("hooks") or {}
    for stage, entries in list(hooks.items()):
        kept = [h for h in entries or () if not _is_mask_hook(h)]
        if len(kept) != len(entries or ()):
            hooks[stage] = kept
            found = True
            notes.append(f"the {stage} hook that masks the driver params (nvct.modifier.prepare), taken out")
    linux = spec.get("linux") or {}
    found = found or any(str(d.get("path", "")).startswith("/dev/nvidia") for d in linux.get("devices") or ())
    return found


def _is_mask_hook(hook: dict) -> bool:
    """The chain the shim leaves when it did the rest (nvct.modifier.prepare): the params mask alone."""
    args = hook.get("args") or []
    if not all(isinstance(a, str) for a in args):
        return False
    chain = as_chain(Hook("createContainer", str(hook.get("path") or ""), tuple(args)))
    return (chain is not None and chain.root is not None and len(chain.steps) == 1
            and isinstance(chain.steps[0], MaskParams))


def _candidates(driver, devices: set, cdi_first: bool) -> list:
    """NVIDIA_VISIBLE_DEVICES values that may have given ``devices`` (None: unset); of two that give
    the same edits the first is taken, so in cdi mode CDI names come first."""
    try:
        gpus = driver.gpus
    except NvctError:
        gpus = ()
    migs = [m for g in gpus for m in g.migs
            if {f"/dev/nvidia-caps/nvidia-cap{m.gi_cap_minor}", f"/dev/nvidia-caps/nvidia-cap{m.ci_cap_minor}"}
            <= devices]
    parents = {m.gpu_index for m in migs}
    whole = [str(g.index) for g in gpus if g.device_path in devices and g.index not in parents]
    names = whole + [m.name for m in migs]
    out: list = [None, "all", "nvidia.com/gpu=all"]
    if names:
        by_name = [",".join(f"nvidia.com/gpu={n}" for n in names), ",".join(names)]
        out += by_name if cdi_first else by_name[::-1]
    elif "/dev/nvidiactl" in devices:
        out.append("none")
    return out


def edits_of(spec: dict, config, driver) -> ContainerEdits | None:
    """The edits the shim would add for ``spec``'s request (without a bundle: nothing is planned)."""
    try:
        request = request_mod.from_spec(spec, config)
        if not request.is_gpu:
            return ContainerEdits()
        mode, _ = modes.resolve_mode(config.mode, request)
        if mode == "legacy":
            return None
        if mode == "cdi":
            return cdi_modes.edits_for(request, config)

        return injection.container_edits(request, driver, config, generation=for_jit(config),
                                         sandbox=sandbox.wanted(spec, config)[0])
    except NvctError:
        return None


def _drop_edits(spec: dict, edits: ContainerEdits) -> None:
    """Take ``edits``' nodes, their device rules, mounts and hooks out of ``spec``."""
    nodes = {n.path: n for n in edits.device_nodes}
    numbers = {(n.major, n.minor) for n in edits.device_nodes}
    mounts = {(m.container_path, m.host_path) for m in edits.mounts}
    hooks = {(h.path, tuple(h.args)) for h in edits.hooks}
    linux = spec.get("linux") or {}
    if linux.get("devices"):
        linux["devices"] = [d for d in linux["devices"] if d.get("path") not in nodes]
    rules = (linux.get("resources") or {}).get("devices")
    if rules:
        linux["resources"]["devices"] = [r for r in rules if not (r.get("allow") and r.get("type") == "c" and
                                                                  (r.get("major"), r.get("minor")) in numbers)]
    spec["mounts"] = [m for m in spec.get("mounts") or () if (m.get("destination"), m.get("source")) not in mounts]
    for stage, entries in (spec.get("hooks") or {}).items():
        spec["hooks"][stage] = [h for h in entries or () if (h.get("path"), tuple(h.get("args") or ())) not in hooks]
