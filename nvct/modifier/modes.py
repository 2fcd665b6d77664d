"""How the shim changes a GPU container's spec, per ``nvidia-container-runtime.mode``.

* ``legacy``: insert the prestart hook, which does the work inside the container;
* ``jit-cdi``: compute the edits now and write them into the spec;
* ``cdi``: resolve the requested CDI device names from the spec dirs;
* ``csv``: a Jetson's CSV lists (:mod:`nvct.edits.csvmode`), written into the spec as jit-cdi's edits;
* ``auto``: ``cdi`` when every requested device is a CDI name, else ``jit-cdi``.

``nvct explain`` calls the same functions, so what it prints is what the shim does.
"""

from __future__ import annotations

import os
import sys

from nvct.edits import apply
from nvct.edits.model import ContainerEdits, Hook, hook_env
from nvct.oci import spec as ocispec
from nvct.oci.runtime import which
from nvct.request.container import VISIBLE_DEVICES, Request

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

    from nvct.edits.model import Chain

HOOK_NAME = "nvidia-container-runtime-hook"
#: Set in the legacy hook's env: the log format the runtime was asked for.
LOG_FORMAT_ENV = "NVCT_LOG_FORMAT"
#: Set in the legacy hook's env: the shim inserted it for a spec that names a request (the shim's
#: sh front does so without parsing the request), so the hook's sh front need not look.
GPU_REQUEST_ENV = "NVCT_GPU_REQUEST"
#: Set in the legacy hook's env: the content identity of the config the shim decided with; the
#: hook reads the copy the shim kept of it (nvct.config.file.load), never config.toml a second time.
CONFIG_DIGEST_ENV = "NVCT_CONFIG_DIGEST"


class Modification:
    """What the shim did to one spec, for the log line and ``nvct explain``."""

    __slots__ = ("mode", "why", "edits", "devices", "plan")

    def __init__(self, mode: str, why: str, edits: ContainerEdits | None = None, devices: tuple[str, ...] = (),
                 plan=None):
        self.mode = mode
        self.why = why
        self.edits = edits if edits is not None else ContainerEdits()
        self.devices = devices
        #: ``prepare="write"``: the root's writes (nvct.modifier.prepare.Plan) the caller makes once the
        #: spec can be saved.
        self.plan = plan


def resolve_mode(configured: str, request: Request) -> tuple[str, str]:
    """The mode to use and why."""
    if configured == "auto":
        if request.only_cdi_devices:
            return "cdi", "auto: every requested device is a CDI name"
        return "jit-cdi", "auto: devices requested by id, edits computed at create time"
    return configured, f"configured mode {configured!r}"


def modify(spec: dict[str, Any], request: Request, config, *, driver=None,
           log_format: str | None = None, bundle: str | None = None,
           runtime: str | None = None, prepare: str | None = None) -> Modification:
    """Change ``spec`` in place for ``request``; the caller saves it.

    ``log_format`` (runc's ``--log-format``) is handed to the legacy hook, so
    both write the log file in one format. With ``bundle``, the jit-cdi hook
    is told the container's root, so it needs to read neither its stdin nor
    config.json. ``runtime``: the low-level runtime's path (see
    :func:`_read_only_root_last`). ``prepare="write"`` (the shim): the hook
    chain's file steps are to be done now, in the container's root
    (:mod:`nvct.modifier.prepare`), where they can be done exactly; the result's
    ``plan`` holds them, for the caller to write once the spec is staged
    (nothing goes into the root of a spec that cannot be saved); ``"plan"``
    (``nvct explain``): change the spec as that would, writing nothing.
    """
    mode, why = resolve_mode(config.mode, request)
    from nvct.base.log import logger

    logger.debug("request %r; mode %s: %s", request, mode, why)
    if mode == "legacy":
        return _legacy(spec, config, why, request, log_format, driver)
    if mode == "csv":
        return _csv(spec, request, config, why, driver, bundle, runtime, prepare)
    if mode == "cdi":
        from nvct.cdi import modes as cdi_modes

        edits = cdi_modes.edits_for(request, config)
        if request.requirements and not request.disable_require:
            from nvct.discover.driver import Driver

            driver = driver or Driver.from_config(config)
            nodes = {n.path for n in edits.device_nodes}
            check_requirements(request, driver, config,
                               gpus=[g for g in driver.gpus if driver.gpu_node(g).path in nodes])
        plan = _into_spec(spec, edits, bundle, config, runtime, prepare)
        return Modification("cdi", why, edits, request.devices or (), plan)
    from nvct.cdi.features import for_jit
    from nvct.discover.driver import Driver
    from nvct.edits import build as injection, sandbox

    driver = driver or Driver.from_config(config)
    hookless, sandbox_why = sandbox.wanted(spec, config)
    if hookless:
        why += f"; sandbox edits, no hooks ({sandbox_why})"
    edits = injection.container_edits(request, driver, config, generation=for_jit(config), sandbox=hookless)
    if bundle:
        edits.hooks = [_with_container_root(h, ocispec.rootfs(spec, bundle)) for h in edits.hooks]
    check_requirements(request, driver, config)
    edits.env.append(f"{VISIBLE_DEVICES}=void")
    plan = _into_spec(spec, edits, bundle, config, runtime, prepare)
    return Modification("jit-cdi", why, edits, request.devices or (), plan)


def _csv(spec: dict[str, Any], request: Request, config, why: str, driver, bundle: str | None,
         runtime: str | None, prepare: str | None) -> Modification:
    """Tegra: the board's CSV lists (:mod:`nvct.edits.csvmode`), into the spec as jit-cdi's edits."""
    from nvct.discover.driver import Driver
    from nvct.edits import csvmode
    from nvct.edits.build import hook_executable, ldconfig_setting

    driver = driver or Driver.from_config(config)
    edits = csvmode.container_edits(driver, csvmode.files_for(request, config), hook_path=hook_executable(config),
                                    ldconfig=ldconfig_setting(config))
    if bundle:
        edits.hooks = [_with_container_root(h, ocispec.rootfs(spec, bundle)) for h in edits.hooks]
    check_requirements(request, driver, config)
    plan = _into_spec(spec, edits, bundle, config, runtime, prepare)
    return Modification("csv", why, edits, request.devices or (), plan)


def _into_spec(spec: dict[str, Any], edits: ContainerEdits, bundle: str | None, config,
               runtime: str | None, prepare: str | None):
    """jit-cdi's and cdi mode's edits into the spec: mount targets checked (no volume under /proc),
    nvct's hook chain done now where it can be (:func:`_prepared`), else a read-only root left to
    the chain's end. The plan to write, for ``prepare="write"``."""
    from nvct.rootfs import mounttargets

    mounttargets.check_proc(spec, ocispec.rootfs(spec, bundle) if bundle else None)
    _check_targets(spec, edits, bundle)
    plan = _prepared(spec, edits, bundle, config) if prepare else None
    if plan is None:
        from nvct.edits.model import join_chains

        edits.hooks = join_chains(edits.hooks)
        _read_only_root_last(spec, edits, runtime)
    if bundle:
        _root_identity(spec, edits, ocispec.rootfs(spec, bundle), plan)
    _apply(spec, edits)
    if plan is not None and prepare != "write":
        plan.root.close()
        return None
    return plan


def _check_targets(spec: dict[str, Any], edits: ContainerEdits, bundle: str | None) -> None:
    """The runtime will create our mount targets: none may be led into an engine's bind mount."""
    if bundle and edits.mounts:
        from nvct.rootfs import mounttargets

        mounttargets.check(spec, ocispec.rootfs(spec, bundle), [m.container_path for m in edits.mounts])


def _prepared(spec: dict[str, Any], edits: ContainerEdits, bundle: str | None, config):
    """nvct's hook chain to be done now by :mod:`nvct.modifier.prepare`, leaving the hook only the params mask."""
    if not bundle:
        return None
    from nvct.base.log import logger
    from nvct.modifier import prepare

    plan = prepare.plan(spec, edits, ocispec.rootfs(spec, bundle), bundle, config.proc_root)
    if plan is None:
        logger.debug("hook chain left to the hook (see nvct.modifier.prepare for when)")
        return None
    logger.debug("hook chain done before the runtime; the hook only masks the driver params")
    mounts = len(edits.mounts)
    plan.edit(edits)
    if len(edits.mounts) != mounts:
        _check_targets(spec, edits, bundle)  # the bind-mount steps' targets
    return plan


def _with_container_root(hook: Hook | Chain, rootfs: str) -> Hook | Chain:
    """nvct's chain told the root, so the hook needs neither its stdin nor config.json."""
    from nvct.edits.model import as_chain

    chain = as_chain(hook)
    return hook if chain is None else chain.replace(root=rootfs)


def _root_identity(spec: dict[str, Any], edits: ContainerEdits, rootfs: str, plan) -> None:
    """The root's identity, verified here on the host, into the chain the hook runs (issue 22).

    In the container's mount namespace the runtime may have mounted another directory over
    the root's name (it lost a race against the path's owner): the hook refuses that one.
    ``plan``'s root is open already; else it is opened (and checked) once more here.
    """
    from nvct.edits.model import as_chain

    chains = [i for i, h in enumerate(edits.hooks) if (c := as_chain(h)) is not None and c.root]
    if not chains:
        return
    if plan is not None:
        st = os.fstat(plan.root.fileno())
        identity = (st.st_dev, st.st_ino)
    else:
        from nvct.base.errors import ContainerError
        from nvct.rootfs.root import UnsafeRootError, root_identity

        try:
            identity = root_identity(rootfs, ocispec.root_owners(spec))
        except UnsafeRootError:
            raise
        except ContainerError:
            return  # missing, ...: the runtime says so
    for i in chains:
        chain = as_chain(edits.hooks[i])
        if chain is not None:
            edits.hooks[i] = chain.replace(identity=identity)


#: Low-level runtimes that make ``root.readonly`` read-only before the createContainer hooks.
_READ_ONLY_BEFORE_HOOKS = ("crun",)


def _read_only_root_last(spec: dict[str, Any], edits: ContainerEdits, runtime: str | None) -> None:
    """Under crun, let nvct's hook chain make a read-only root read-only, after its writes.

    crun remounts the root read-only before createContainer hooks run, so the
    chain's links and ld cache (the reference's hooks too) fail in every
    ``readOnlyRootFilesystem`` GPU container. runc does it after the hooks.
    The chain's last step, ``readonly-root``, does it instead, or fails the start.
    """
    root = spec.get("root")
    if not (runtime and isinstance(root, dict) and root.get("readonly") is True):
        return
    if os.path.basename(os.path.realpath(runtime)) not in _READ_ONLY_BEFORE_HOOKS:
        return
    from nvct.edits.model import as_chain
    from nvct.edits.steps import ReadonlyRoot

    for i, hook in enumerate(edits.hooks):
        chain = as_chain(hook)
        if hook.hook_name == "createContainer" and chain is not None:
            edits.hooks[i] = chain.replace(steps=(*chain.steps, ReadonlyRoot()))
            root["readonly"] = False
            return


def _apply(spec: dict[str, Any], edits: ContainerEdits) -> None:
    ocispec.remove_nvidia_hooks(spec)
    apply.apply_edits(spec, edits)


def _legacy(spec: dict[str, Any], config, why: str, request: Request,
            log_format: str | None = None, driver=None) -> Modification:
    devices = request.devices or ()  # what the hook will inject: for the log line
    for node in legacy_device_rules(request, config, driver).device_nodes:  # the nodes are the hook's
        apply.allow_device(spec, node)
    if ocispec.has_nvidia_hook(spec):
        return Modification("legacy", why + "; an NVIDIA prestart hook is already present", devices=devices)
    hook = legacy_hook(config, log_format)
    apply.add_hook(spec, hook)
    return Modification("legacy", why, ContainerEdits(hooks=[hook]), devices)


def legacy_device_rules(request: Request, config, driver=None) -> ContainerEdits:
    """The device nodes legacy's hook will make, for the spec's ``linux.resources.devices``.

    The hook grants them in the container's cgroup behind the runtime's back;
    systemd (the runtime's systemd cgroup driver) applies the cgroup again from
    the spec's rules alone on ``systemctl daemon-reload``, which took the GPU
    away (docs/cgroups.md). As allow rules in the spec they stay. None with
    ``nvidia-container-cli.no-cgroups`` (the cgroup is not nvct's to touch):
    only then may the shim's sh front append the hook itself (:func:`legacy_record`).
    """
    if config.cli_no_cgroups:
        return ContainerEdits()
    from nvct.discover.driver import Driver
    from nvct.edits import build as injection

    driver = driver or Driver.from_config(config)
    nodes = injection.container_edits(request, driver, config, nodes_only=True).device_nodes
    return ContainerEdits(device_nodes=[n for n in nodes if n.type in ("b", "c")])


def legacy_hook(config, log_format: str | None = None, path: str | None = None) -> Hook:
    """The prestart hook legacy mode appends; the shim's sh front appends it as recorded (:func:`legacy_record`).

    ``path``: the hook program, when the caller resolved it already (:func:`legacy_hook_path`).
    """
    env = [f"{GPU_REQUEST_ENV}=1"]
    if config.path:
        env.append(f"NVIDIA_CTK_CONFIG_FILE_PATH={config.path}")
        if getattr(config, "digest", None):
            env.append(f"{CONFIG_DIGEST_ENV}={config.digest}")
    if log_format:
        env.append(f"{LOG_FORMAT_ENV}={log_format}")
    return Hook("prestart", path or legacy_hook_path(config), (HOOK_NAME, "prestart"),
                hook_env(*env, first=_utility_folders(config)),
                reason="legacy mode: the hook injects the GPU inside the container")


def _utility_folders(config) -> list[str]:
    """The engine's PATH folders that hold the driver's utilities on nodes that keep them apart
    (``/usr/local/nvidia/bin``): the hook finds them on its PATH, as NVIDIA's CLI does."""
    from nvct.discover.utilities import folders_on_path

    return folders_on_path(config.driver_root)


def legacy_record(config, program: str) -> dict[str, str] | None:
    """What the sh front of ``program`` needs to append :func:`legacy_hook` itself, or ``None``.

    ``hook``, ``hook_json``, ``hook_text``: the hook's whole JSON for each runc
    ``--log-format`` (none, json, text), pasted as they are; ``hook_path``: its
    program, which must be there; ``nvidia_hooks``: the names of an NVIDIA hook
    (:data:`nvct.oci.spec.NVIDIA_HOOK_NAMES`), any of which in a spec leaves the
    create to Python. nvct.oci.runtime keeps it in a file the runtime's line
    names. ``None`` where a GPU create must go through Python: another mode,
    device rules to write (every config but ``no-cgroups``), a log file that
    gets a line per start, a hook found on a PATH the next caller may not share.
    """
    if config.mode != "legacy" or config.runtime_debug not in (None, "", "/dev/null"):
        return None
    if not config.cli_no_cgroups:
        return None  # the request's device rules go into the spec: Python's (legacy_device_rules)
    path, on_path = _legacy_hook_path(config)
    if on_path or not os.path.isabs(program) or _utility_folders(config):
        return None  # (the last: a PATH of this caller's that the next may not share)
    from nvct.base import jsoncodec

    record = {"hook_path": path, "nvidia_hooks": " ".join(ocispec.NVIDIA_HOOK_NAMES)}
    for key, log_format in (("hook", None), ("hook_json", "json"), ("hook_text", "text")):
        record[key] = jsoncodec.dumps(apply.hook_entry(legacy_hook(config, log_format, path=path)), compact=True)
    return record


def legacy_hook_path(config) -> str:
    """``nvidia-container-runtime-hook.path`` as an absolute path (beside us, else PATH)."""
    return _legacy_hook_path(config)[0]


def _legacy_hook_path(config) -> tuple[str, bool]:
    """:func:`legacy_hook_path`, and whether it depends on PATH."""
    configured = config.hook_path or HOOK_NAME
    if os.path.isabs(configured):
        return configured, False
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0] or "")), configured)
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside, False
    found = which(configured)
    if found:
        return os.path.abspath(found), True
    return os.path.join("/usr/bin", configured), True


def check_requirements(request: Request, driver, config, *, gpus=None) -> None:
    """Stop the start when an ``NVIDIA_REQUIRE_*`` condition fails against this driver.

    ``gpus``: the container's GPUs, where the caller knows them (cdi mode: those
    whose nodes the resolved CDI devices give), else the request's selection.
    """
    if request.disable_require or not request.requirements:
        return
    from nvct.edits import wsl

    if wsl.is_wsl(driver):
        from nvct.base.log import logger

        logger.warning("WSL2: NVIDIA_REQUIRE_* not checked (the driver is Windows': no module version, and "
                       "its NVML runs only under WSL2)")
        return
    from nvct.edits import csvmode

    if csvmode.is_tegra(driver):
        from nvct.base.log import logger

        logger.warning("Tegra: NVIDIA_REQUIRE_* not checked (a Jetson board has no NVIDIA module version nor "
                       "NVML to check them against)")
        return
    from nvct.request import requirements

    props: set[str] = set()
    for name, expr in request.requirements:
        props |= requirements.parse(expr, name=name).properties
    need_cuda = "cuda" in props
    need_devices = "arch" in props or "brand" in props
    if gpus is None:
        from nvct.edits.build import selection_for

        gpus = selection_for(request, driver, config).all_parents() if need_devices else []
    elif not need_devices:
        gpus = []
    facts = requirements.driver_facts(driver, gpus, need_cuda, need_devices)
    requirements.check(dict(request.env), facts, disable_require=request.disable_require)
