"""``nvct explain``: what a container would get, and why -- computed by the shim's own code.

The spec is changed with :func:`nvct.modifier.modes.modify` on a copy, exactly as the
shim changes it on a container start, so what explain prints is what the
shim would write. In legacy mode the shim only inserts the prestart hook; the
hook then computes, inside the starting container, the same
:func:`nvct.edits.build.container_edits` that jit-cdi writes into the spec, and
explain shows those too. Nothing is written and no container is created. How it is
shown is :mod:`nvct.doctor.explainview`'s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

from nvct.base.errors import NvctError, RequestError
from nvct.cdi import modes as cdi_modes
from nvct.cdi.registry import Registry, container_edits
from nvct.discover.driver import Driver
from nvct.doctor import clipaths
from nvct.doctor.rewritten import edits_of
from nvct.edits import build as injection, steps as kinds
from nvct.edits.build import selection_for
from nvct.edits.model import ContainerEdits, as_chain, with_reason
from nvct.hooks.compat import compat_choice
from nvct.modifier import legacy as realize, modes
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
    #: nvct's edits found in a bundle the shim had already rewritten (see :func:`nvct.doctor.rewritten.unrewrite`).
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

    ``rewritten``: what :func:`nvct.doctor.rewritten.unrewrite` took out of ``spec``, to be shown.
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
    edits = result.inside if result.mode == "legacy" else edits_of(result.before, config, driver)
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
            folder, why = compat_choice(root, compat, result.after or result.before)  # its GPU nodes
    except NvctError as e:
        return f"not decided: {e}"
    return f"{'used' if folder else 'not used'}: {why}"


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


def _legacy_proc(request, driver, config) -> list[str]:
    """The legacy hook's view of /proc/driver/nvidia (nvct.modifier.legacy)."""
    selection = injection.selection_for(request, driver, config)
    return realize.procfs_paths(realize.procfs_view(request, driver, selection))


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
