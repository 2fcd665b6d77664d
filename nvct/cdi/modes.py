"""The shim's ``cdi`` mode: the requested CDI devices' edits, from the spec directories.

Requests come as names in ``NVIDIA_VISIBLE_DEVICES``, as volume mounts under
``/var/run/nvidia-container-devices/cdi/``, or as annotations under the
configured prefixes (:mod:`nvct.request.container` reads all three). A name that is not
fully qualified is a device of ``default-kind`` (``0`` ->
``nvidia.com/gpu=0``; ``none`` -> ``nvidia.com/gpu=none``, as the reference).

Devices of the kind ``runtime.nvidia.com/gpu`` are the reference's
*automatic* devices: their spec is generated for the request, in memory,
instead of being read from disk; they cannot be mixed with other CDI devices.
jit-cdi's ``nvcdi-feature-flags`` and ``nvcdi-disable-hooks`` apply to them, as
in the reference.
"""

from __future__ import annotations

from nvct.base.errors import ConfigError, RequestError
from nvct.cdi.registry import Registry
from nvct.config.keys import Settings
from nvct.edits.model import ContainerEdits
from nvct.request import cdinames as names

DEFAULT_KIND_KEY = Settings.cdi_default_kind.name
SPEC_DIRS_KEY = Settings.cdi_spec_dirs.name
AUTOMATIC_VENDOR = "runtime.nvidia.com"
AUTOMATIC_CLASS = "gpu"
AUTOMATIC_KIND = f"{AUTOMATIC_VENDOR}/{AUTOMATIC_CLASS}"


def requested_names(request, config) -> list[str]:
    """The fully-qualified names a request asks for, in order, without repeats."""
    if request.devices is None:
        return []
    kind = config.cdi_default_kind or "nvidia.com/gpu"
    reason = names.kind_error(kind)
    if reason:
        raise ConfigError(f"{config.path or 'config'}: {DEFAULT_KIND_KEY}: {reason}")
    return list(dict.fromkeys(names.qualify(d, kind) for d in request.devices or ("none",)))


def edits_for(request, config) -> ContainerEdits:
    """Resolve the request's CDI devices to edits (one error for every unknown name)."""
    wanted = requested_names(request, config)
    if not wanted:
        return ContainerEdits()
    automatic = [n for n in wanted if n.startswith(AUTOMATIC_KIND + "=")]
    if automatic:
        if len(automatic) != len(wanted):
            raise RequestError(f"CDI devices of kind {AUTOMATIC_KIND} cannot be requested "
                               f"together with other CDI devices ({', '.join(wanted)})")
        return _automatic_registry(automatic, config).resolve(wanted)
    dirs = config.cdi_spec_dirs or ()
    if isinstance(dirs, str):
        dirs = [dirs]
    return _sealed(Registry(dirs).resolve(wanted))


#: Hook programs nvct ships: in a spec, one of these without ``env`` is nvct's bug or a stale spec.
NVCT_HOOK_PROGRAMS = ("nvct", "nvidia-cdi-hook", "nvidia-ctk", "nvidia-container-runtime-hook")


def _sealed(edits: ContainerEdits) -> ContainerEdits:
    """Give our own hook programs the fixed env a spec on disk forgot, and say so.

    Under runc such a hook would run with the container's environment in the
    container's rootfs (CVE-2025-23266). Another vendor's hook is left as it is:
    ``nvct doctor`` warns about it.
    """
    from nvct.edits.model import HOOK_ENV

    for i, hook in enumerate(edits.hooks):
        if not hook.env and hook.path.rsplit("/", 1)[-1] in NVCT_HOOK_PROGRAMS:
            from nvct.base.log import logger

            logger.error("a CDI spec's %s hook %s has no env (an nvct bug, or a spec from an older "
                         "version): run with the fixed hook env; regenerate the spec", hook.hook_name, hook.path)
            edits.hooks[i] = hook.replace(env=HOOK_ENV)
    return edits


def _automatic_registry(wanted: list[str], config) -> Registry:
    """A registry of one spec generated now for just the requested devices."""
    from nvct.cdi import generate, spec as spec_mod
    from nvct.cdi.features import for_jit
    from nvct.discover.driver import Driver
    from nvct.edits.build import hook_executable, ldconfig_setting

    ids = [n.partition("=")[2] for n in wanted]
    raw = generate.generate(Driver.from_config(config), hook_path=hook_executable(config),
                            vendor=AUTOMATIC_VENDOR, cls=AUTOMATIC_CLASS, device_ids=ids,
                            ldconfig=ldconfig_setting(config), generation=for_jit(config), gids=True,
                            requirements=False)  # the shim checks them
    return Registry.from_specs([spec_mod.validate(raw, f"<generated for {', '.join(ids)}>")])
