"""How ``nvct explain`` shows an :class:`~nvct.doctor.explain.Explanation`: text, JSON and the spec diff.

The computation is :mod:`nvct.doctor.explain`'s; this only renders what it found.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from nvct.edits.model import ContainerEdits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvct.doctor.explain import Explanation


def spec_diff(result: Explanation) -> str:
    """The config.json change as a unified diff of the pretty-printed specs."""
    if result.after is None:
        return ""
    before = json.dumps(result.before, indent=2).splitlines(keepends=True)
    after = json.dumps(result.after, indent=2).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, "config.json", "config.json (as the shim writes it)"))


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
