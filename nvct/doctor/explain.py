"""``nvct explain``: what a container would get, and why -- computed by the shim's own code.

The spec is changed with :func:`nvct.modifier.modes.modify` on a copy, exactly as the
shim changes it on a container start, so what explain prints is what the
shim would write. In legacy mode the shim only inserts the prestart hook; the
hook then computes, inside the starting container, the same
:func:`nvct.edits.build.container_edits` that jit-cdi writes into the spec, and
explain shows those too. Nothing is written and no container is created.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

from nvct.base.errors import NvctError, RequestError
from nvct.cdi import modes as cdi_modes
from nvct.cdi.features import for_jit
from nvct.cdi.registry import Registry, container_edits
from nvct.discover.driver import Driver
from nvct.doctor import clipaths
from nvct.edits import build as injection, sandbox, steps as kinds
from nvct.edits.build import selection_for
from nvct.edits.model import ContainerEdits, Hook, as_chain, with_reason
from nvct.edits.steps import MaskParams
from nvct.hooks.compat import compat_choice
from nvct.modifier import legacy as realize, modes
from nvct.modifier.modes import GPU_REQUEST_ENV
from nvct.oci import runtime as lowlevel, spec as ocispec
from nvct.oci.spec import merge_env
from nvct.request import container as request_mod, requirements
from nvct.request.container import VISIBLE_DEVICES
from nvct.rootfs.root import Rootfs

#: Where NVIDIA_REQUIRE_* conditions are enforced, per mode.
ENFORCED_BY = {"legacy": "the prestart hook", "jit-cdi": "the shim", "cdi": None}

DEFAULT_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_ENV_REASONS = {
    "jit-cdi": {f"{VISIBLE_DEVICES}=void": "jit-cdi: the GPUs are in the spec already, so no NVIDIA hook "
                                           "may inject them a second time"},
}


@dataclass
class Explanation:
    """Everything ``nvct explain`` prints; ``error`` is the one line the shim would fail with."""

    configured_mode: str
    before: dict
    after: dict | None = None
    request: Any = None
    mode: str | None = None
    why: str = ""
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    env_reasons: dict[str, str] = field(default_factory=dict)
    #: legacy mode: what the hook does inside the container.
    inside: ContainerEdits | None = None
    #: legacy mode: what the container's /proc/driver/nvidia shows (paths below it).
    inside_proc: list | None = None
    requirements: list = field(default_factory=list)
    requirements_note: str = ""
    error: str | None = None
    #: nvct's edits found in a bundle the shim had already rewritten (see :func:`unrewrite`).
    rewritten: list = field(default_factory=list)
    #: CUDA forward compat: "used: why", "not used: why" or "not decided: why"; "" without the step.
    compat: str = ""


def spec_from_options(env: Sequence[str] = (), *, privileged: bool = False,
                      mounts: Sequence[str] = (), annotations: Sequence[str] = (),
                      base: dict | None = None) -> dict:
    """An OCI spec as a container engine would pass it (``base``, or a minimal one) plus options.

    ``env`` and ``annotations`` are ``K=V``; ``mounts`` are ``SRC:DST`` bind mounts
    (how device plugins list devices: ``/dev/null:/var/run/nvidia-container-devices/0``).
    """
    spec: dict[str, Any] = copy.deepcopy(base) if base is not None else {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": [DEFAULT_ENV], "cwd": "/",
                    "capabilities": {"bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]}},
        "root": {"path": "rootfs"},
        "mounts": [],
        "linux": {},
    }
    process = spec.setdefault("process", {})
    if env:
        for item in env:
            _pair(item, "-e")
        process["env"] = merge_env(process.get("env") or [], list(env))
    if privileged:
        caps = process.setdefault("capabilities", {})
        if isinstance(caps, list):
            caps.append("CAP_SYS_ADMIN")
        else:
            for kind in ("bounding", "effective", "permitted"):
                if "CAP_SYS_ADMIN" not in caps.setdefault(kind, []):
                    caps[kind].append("CAP_SYS_ADMIN")
    for m in mounts:
        src, sep, dst = m.partition(":")
        if not sep or not src or not dst.startswith("/"):
            raise RequestError(f"--mount {m!r}: expected SRC:DST with an absolute DST")
        spec.setdefault("mounts", []).append({"destination": dst, "type": "bind", "source": src,
                                              "options": ["rbind", "ro"]})
    for a in annotations:
        key, value = _pair(a, "--annotation")
        spec.setdefault("annotations", {})[key] = value
    return spec


def _runtime(config) -> str | None:
    """The low-level runtime the shim would run (it changes how a read-only root is made)."""
    try:
        return lowlevel.find(config.runtimes)
    except NvctError:
        return None


def explain(spec: dict, config, *, driver=None, bundle: str | None = None,
            rewritten: Sequence[str] = ()) -> Explanation:
    """What the shim (and, in legacy mode, the hook) would do to ``spec`` under ``config``.

    ``rewritten``: what :func:`unrewrite` took out of ``spec``, to be shown.
    """
    result = Explanation(configured_mode=config.mode, before=copy.deepcopy(spec), rewritten=list(rewritten))
    try:
        result.request = request_mod.from_spec(spec, config)
    except NvctError as e:
        result.error = str(e)
        return result
    if not result.request.is_gpu:
        result.why = _no_gpu_reason(result.request)
        result.after = copy.deepcopy(spec)
        return result
    try:
        result.mode, result.why = modes.resolve_mode(config.mode, result.request)
    except NvctError as e:
        result.error = str(e)
        return result
    if result.mode != "cdi":
        driver = driver or Driver.from_config(config)
    after = copy.deepcopy(spec)
    try:
        modification = modes.modify(after, result.request, config, driver=driver, bundle=bundle,
                                    runtime=_runtime(config), prepare="plan")
        result.after = after
        result.edits = modification.edits
        result.why = modification.why  # jit-cdi's names sandbox edits
        if result.mode == "legacy":
            if modification.edits.hooks:
                result.inside = injection.container_edits(result.request, driver, config)
                result.inside_proc = _legacy_proc(result.request, driver, config)
                modes.check_requirements(result.request, driver, config)
        elif result.mode == "cdi":
            _cdi_reasons(result, config)
    except NvctError as e:
        result.error = str(e)
    result.env_reasons = dict(_ENV_REASONS.get(result.mode, {}))
    if result.mode == "cdi":
        result.env_reasons.update({e: "from the CDI spec" for e in result.edits.env})
    _requirements(result, config, driver)
    if result.error is None:
        result.compat = _compat(result, config, driver, bundle)
    return result


def _compat(result: Explanation, config, driver, bundle: str | None) -> str:
    """Whether the image's CUDA compat libcuda would be used, by the hook's own rule (hooks.compat.compat_choice).

    Error 804 ("forward compatibility was attempted on non supported HW") is the
    usual report when it is used where it cannot work: this says which way and why.
    """
    edits = result.inside if result.mode == "legacy" else _edits_of(result.before, config, driver)
    compat = None
    for hook in edits.hooks if edits is not None else ():
        chain = as_chain(hook)
        if chain is None:  # NVIDIA's: [nvidia-ctk] [hook] <name> flags...
            argv = list(hook.args[1:])
            argv = argv[1:] if argv[:1] == ["hook"] else argv
            found = tuple(kinds.parse(argv))
        else:
            found = tuple(chain.steps)
        compat = next((s for s in found if isinstance(s, kinds.EnableCudaCompat)), compat)
    if compat is None:
        return ""
    if not bundle:
        return "not decided: no bundle, so no image to look into (nvct explain --bundle)"
    try:
        with Rootfs(ocispec.rootfs(result.before, bundle), owners=ocispec.root_owners(result.before)) as root:
            folder, why = compat_choice(root, compat)
    except NvctError as e:
        return f"not decided: {e}"
    return f"{'used' if folder else 'not used'}: {why}"


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
        edits = _edits_of(trial, config, driver)
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


def _edits_of(spec: dict, config, driver) -> ContainerEdits | None:
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


def _no_gpu_reason(request) -> str:
    value = request.env.get(VISIBLE_DEVICES)
    if value is None:
        seen = f"{VISIBLE_DEVICES} is not set"
    elif value.strip() in ("", "void"):
        seen = f"{VISIBLE_DEVICES}={value!r}"
    else:
        seen = (f"{VISIBLE_DEVICES} is ignored in an unprivileged container "
                f"(accept-nvidia-visible-devices-envvar-when-unprivileged = false)")
    return f"no GPU requested ({seen}): the shim passes the container through untouched"


def _cdi_reasons(result: Explanation, config) -> None:
    """Say which spec file and device each edit of cdi mode came from."""
    wanted = cdi_modes.requested_names(result.request, config)
    if any(n.startswith(cdi_modes.AUTOMATIC_KIND + "=") for n in wanted):
        _fill_reasons(result.edits, {}, f"generated for this request ({cdi_modes.AUTOMATIC_KIND})")
        return
    dirs = config.cdi_spec_dirs or ()
    registry = Registry([dirs] if isinstance(dirs, str) else dirs)
    reasons: dict = {}
    for name in wanted:
        device = registry.devices.get(name)
        if device is None:
            continue
        for edits, why in ((container_edits(device.edits, device.spec.path), f"CDI device {name} ({device.spec.path})"),
                           (container_edits(device.spec.edits, device.spec.path),
                            f"common edits of CDI spec {device.spec.path}")):
            for item in edits.device_nodes + edits.mounts + edits.hooks:
                reasons.setdefault(item, why)
    _fill_reasons(result.edits, reasons, "from a CDI spec")


def _fill_reasons(edits: ContainerEdits, reasons: dict, default: str) -> None:
    edits.device_nodes = [n if n.reason else with_reason(n, reasons.get(n, default)) for n in edits.device_nodes]
    edits.mounts = [m if m.reason else with_reason(m, reasons.get(m, default)) for m in edits.mounts]
    edits.hooks = [h if h.reason else with_reason(h, reasons.get(h, default)) for h in edits.hooks]


def _requirements(result: Explanation, config, driver) -> None:
    request = result.request
    if not request.requirements:
        return

    enforced = ENFORCED_BY.get(result.mode or "")
    result.requirements_note = (f"enforced by {enforced}" if enforced else
                                f"not enforced in {result.mode} mode")
    driver = driver or Driver.from_config(config)
    props: set[str] = set()
    try:
        for name, expr in request.requirements:
            props |= requirements.parse(expr, name=name).properties
        gpus = []
        if ("arch" in props or "brand" in props) and result.mode != "cdi":
            gpus = selection_for(request, driver, config).all_parents()
        try:
            facts = requirements.driver_facts(driver, gpus, "cuda" in props, bool(gpus))
        except NvctError as e:
            facts = requirements.DriverFacts(driver=_version_or_none(driver))
            result.requirements_note += f"; CUDA version and devices unknown ({e}): their conditions hold"
        result.requirements = requirements.explain(dict(request.env), facts,
                                                   disable_require=request.disable_require)
    except NvctError as e:
        result.requirements_note += f"; {e}"


def _version_or_none(driver) -> str | None:
    try:
        return driver.version
    except NvctError:
        return None


def spec_diff(result: Explanation) -> str:
    """The config.json change as a unified diff of the pretty-printed specs."""
    if result.after is None:
        return ""
    before = json.dumps(result.before, indent=2).splitlines(keepends=True)
    after = json.dumps(result.after, indent=2).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "config.json", "config.json (as the shim writes it)"))


def _legacy_proc(request, driver, config) -> list[str]:
    """The legacy hook's view of /proc/driver/nvidia (nvct.modifier.legacy)."""
    selection = injection.selection_for(request, driver, config)
    return realize.procfs_paths(realize.procfs_view(request, driver, selection))


def to_json(result: Explanation, *, diff: bool = False) -> dict:
    out: dict[str, Any] = {
        "configured_mode": result.configured_mode,
        "mode": result.mode,
        "why": result.why,
        "request": _request_json(result.request),
        "edits": _edits_json(result.edits, result.env_reasons),
        "inside": _edits_json(result.inside, {}) if result.inside is not None else None,
        "inside_proc": result.inside_proc,
        "requirements": {
            "note": result.requirements_note,
            "checks": [{"variable": name, "expression": expr, "holds": any(all(h for _, h in alt) for alt in alts),
                        "alternatives": [[{"condition": c, "holds": h} for c, h in alt] for alt in alts]}
                       for name, expr, alts in result.requirements],
        },
        "error": result.error,
        "rewritten": result.rewritten,
        "cuda_compat": result.compat or None,
    }
    if result.mode == "legacy" and result.inside is not None:
        out["inside_note"] = ("legacy mode: the shim only inserts the prestart hook; at container start the "
                              "hook does 'inside' in the container (the same edits jit-cdi writes into the spec)")
    if diff:
        out["diff"] = spec_diff(result)
    return out


def _request_json(request) -> dict | None:
    if request is None:
        return None
    return {
        "devices": list(request.devices) if request.devices is not None else None,
        "source": request.source,
        "capabilities": list(request.capabilities),
        "requirements": [list(r) for r in request.requirements],
        "disable_require": request.disable_require,
        "mig_config": list(request.mig_config),
        "mig_monitor": list(request.mig_monitor),
        "imex_channels": list(request.imex_channels),
        "features": sorted(request.features),
        "privileged": request.privileged,
        "legacy_image": request.legacy_image,
    }


def _edits_json(edits: ContainerEdits, env_reasons: dict) -> dict:
    out = edits.to_json()
    if edits.env:
        out["envReasons"] = {e: env_reasons.get(e, "") for e in edits.env}
    return out


def render_text(result: Explanation, *, diff: bool = False) -> str:
    lines = []
    if result.rewritten:
        lines.append("bundle:   already rewritten by nvct's shim; explained is the spec as the engine passed it:")
        lines += [f"  {note}" for note in result.rewritten]
    request = result.request
    if request is not None:
        lines.append("request:  " + _request_line(request))
    if result.mode:
        lines.append(f"mode:     {result.mode} ({result.why})")
    elif result.why:
        lines.append(f"mode:     none: {result.why}")
    if result.error:
        lines.append(f"error:    the container would not start: {result.error}")
    if result.mode == "legacy" and result.edits.hooks:
        lines.append("the shim inserts:")
        lines += _edit_lines(result.edits, {})
        if result.inside is not None:
            lines.append("the hook then does, inside the container at start (the same edits jit-cdi "
                         "writes into the spec):")
            lines += _edit_lines(result.inside, {})
            if result.inside_proc is not None:
                lines.append("  /proc/driver/nvidia (a read-only tmpfs, when the kernel has it): "
                             + ", ".join(result.inside_proc))
    elif result.mode == "legacy":
        lines.append(f"the shim changes nothing: {result.why}")
    elif result.mode and not result.error:
        lines.append("the shim writes into config.json:")
        lines += _edit_lines(result.edits, result.env_reasons)
    if result.requirements or result.requirements_note:
        lines.append(f"requirements ({result.requirements_note}):")
        for name, expr, alts in result.requirements:
            verdict = "ok" if any(all(h for _, h in alt) for alt in alts) else "FAILS"
            detail = " | ".join(", ".join(f"{c} {'ok' if h else 'fails'}" for c, h in alt) for alt in alts)
            lines.append(f"  {name}={expr!r}: {verdict} ({detail})")
    if result.compat:
        lines.append(f"cuda compat: {result.compat}")
    if diff:
        lines.append(spec_diff(result).rstrip("\n") or "(config.json unchanged)")
    return "\n".join(lines) + "\n"


def _request_line(request) -> str:
    if request.devices is None:
        devices = "none asked for"
    else:
        devices = ", ".join(request.devices) if request.devices else "none (driver files only)"
    parts = [f"devices {devices} (from {request.source})",
             f"capabilities {','.join(request.capabilities)}"]
    if request.privileged:
        parts.append("privileged")
    if request.features:
        parts.append("features " + ",".join(sorted(request.features)))
    if request.mig_config or request.mig_monitor:
        parts.append(f"MIG config {','.join(request.mig_config) or '-'}, "
                     f"monitor {','.join(request.mig_monitor) or '-'}")
    if request.imex_channels:
        parts.append("IMEX channels " + ",".join(request.imex_channels))
    if request.legacy_image:
        parts.append("legacy image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA)")
    return "; ".join(parts)


def _edit_lines(edits: ContainerEdits, env_reasons: dict) -> list[str]:
    lines = []
    if edits.device_nodes:
        lines.append(f"  device nodes ({len(edits.device_nodes)}):")
        for n in edits.device_nodes:
            mode = f" {n.file_mode:04o}" if n.file_mode is not None else ""
            host = f" <- {n.host_path}" if n.host_path and n.host_path != n.path else ""
            lines.append(f"    {n.path} {n.type} {n.major}:{n.minor}{mode}{host}  # {n.reason}")
    if edits.mounts:
        lines.append(f"  mounts ({len(edits.mounts)}):")
        for m in edits.mounts:
            host = f" <- {m.host_path}" if m.host_path != m.container_path else ""
            lines.append(f"    {m.container_path}{host} ({','.join(m.options)})  # {m.reason}")
    if edits.env:
        lines.append(f"  env ({len(edits.env)}):")
        lines += [f"    {e}" + (f"  # {env_reasons[e]}" if env_reasons.get(e) else "") for e in edits.env]
    if edits.hooks:
        lines.append(f"  hooks ({len(edits.hooks)}):")
        for h in edits.hooks:
            env = f" env {' '.join(h.env)}" if h.env else ""
            lines.append(f"    {h.hook_name}: {h.path} {' '.join(h.args[1:])}{env}  # {h.reason}")
    if not lines:
        lines.append("  nothing")
    return lines


def _pair(item: str, option: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise RequestError(f"{option} {item!r}: expected KEY=VALUE")
    return key, value


def explain_gpus(cli: str, value: str, route, dirs: Sequence[str]) -> dict:
    """``CLI run --gpus VALUE`` on this node: the path it takes (:mod:`nvct.doctor.clipaths`) and what it gets.

    On the CDI path the names are resolved in the engine's spec directories, as the
    engine resolves them; on the hook path the hook gets NVIDIA_VISIBLE_DEVICES.
    """
    out: dict = {"cli": cli, "value": value, "path": route.route, "why": route.why, "program": route.program,
                 "spec_dirs": list(dirs), "error": None}
    if route.route == clipaths.CDI:
        out["names"] = clipaths.cdi_names(cli, value)
        try:
            out["edits"] = Registry(dirs).resolve(out["names"])
        except RequestError as e:
            out["error"] = str(e)
    elif route.route == clipaths.HOOK:
        out["env"] = f"{VISIBLE_DEVICES}={clipaths.hook_devices(cli, value)}"
    else:
        out["error"] = route.why
    return out


def render_gpus(result: dict) -> str:
    head = f"{result['cli']} run --gpus {result['value']}:"
    lines = [f"{head} no path" if result["error"] and not result.get("names")
             else f"{head} the {result['path']} path ({result['why']})"]
    if result.get("names"):
        lines.append(f"CDI devices: {', '.join(result['names'])} (from {', '.join(result['spec_dirs'])})")
    if result.get("env"):
        lines.append(f"the hook ({result['program']}) gets {result['env']}; what it then does: "
                     f"nvct explain -e {result['env']} (legacy mode)")
    if result["error"]:
        lines.append(f"error:    the container would not start: {result['error']}")
    elif result.get("edits") is not None:
        lines.append("the engine applies from the spec:")
        lines += _edit_lines(result["edits"], {})
    return "\n".join(lines) + "\n"
