"""What a container asks for, read from its OCI spec and nvct's config.

Every rule here keeps the reference toolkit's meaning, so device plugins and
images written for it behave the same. Deliberate differences (each one a
reference bug) are listed in docs/differences.md.

This module is on the shim's hot path: standard library only.
"""

from __future__ import annotations

import os

from nvct.base.errors import RequestError
from nvct.config.file import ALL_CAPABILITIES, Config

TYPE_CHECKING = False  # typing and dataclasses cost ~10 ms on every container start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
MIG_CONFIG_DEVICES = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR_DEVICES = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX_CHANNELS = "NVIDIA_IMEX_CHANNELS"
REQUIRE_CUDA = "NVIDIA_REQUIRE_CUDA"
CUDA_VERSION = "CUDA_VERSION"

#: Where device plugins list devices as ``/dev/null`` volume mounts.
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"

DEFAULT_CAPABILITIES = ("compute", "utility")

#: Env vars that switch on extra device classes, when set to "enabled".
GATED_FEATURES = {
    "NVIDIA_GDS": "gds",
    "NVIDIA_MOFED": "mofed",
    "NVIDIA_NVSWITCH": "nvswitch",
    "NVIDIA_GDRCOPY": "gdrcopy",
}

_MAX_DEVICE_IDS = 4096


class Request:
    """The resolved request of one container.

    ``devices`` is ``None`` when the container asks for no GPU at all (unset,
    empty or ``void``): it then passes through untouched. An empty tuple
    (``none``) still gets the driver's libraries and utilities.
    """

    def __init__(self, devices: tuple[str, ...] | None, *,
                 capabilities: tuple[str, ...] = DEFAULT_CAPABILITIES,
                 requirements: tuple[tuple[str, str], ...] = (), disable_require: bool = False,
                 mig_config: tuple[str, ...] = (), mig_monitor: tuple[str, ...] = (),
                 imex_channels: tuple[str, ...] = (), features: frozenset[str] = frozenset(),
                 privileged: bool = False, legacy_image: bool = False, source: str = "env",
                 env: Mapping[str, str] | None = None):
        self.devices = devices
        self.capabilities = capabilities
        self.requirements = requirements
        self.disable_require = disable_require
        self.mig_config = mig_config
        self.mig_monitor = mig_monitor
        self.imex_channels = imex_channels
        self.features = features
        self.privileged = privileged
        self.legacy_image = legacy_image
        self.source = source
        self.env = env if env is not None else {}

    def __repr__(self) -> str:
        return f"Request(devices={self.devices!r}, capabilities={self.capabilities!r}, source={self.source!r})"

    @property
    def is_gpu(self) -> bool:
        return self.devices is not None

    @property
    def all_devices(self) -> bool:
        return self.devices == ("all",)

    @property
    def cdi_devices(self) -> tuple[str, ...]:
        """The requested devices that are fully-qualified CDI names."""
        return tuple(d for d in self.devices or () if is_qualified_cdi_name(d))

    @property
    def only_cdi_devices(self) -> bool:
        devices = self.devices or ()
        return bool(devices) and all(is_qualified_cdi_name(d) for d in devices)


def might_request_gpu(raw: bytes, config: Config) -> bool:
    """Whether a config.json's bytes can hold a GPU request at all; False means surely not.

    Lets the shim pass a container through without importing json. Every way
    to ask (the env vars, the device-list mounts, the annotation prefixes)
    leaves its name in the bytes, unless JSON escapes hide it: any backslash
    means the spec is parsed after all.
    """
    return any(name.encode("utf-8", "surrogateescape") in raw for name in request_markers(config))


def request_markers(config: Config) -> list[str]:
    """The strings of which a config.json that can ask for a GPU holds at least one: the names a
    request may use under ``config``, and a backslash (a JSON escape may hide a name). The sh
    fronts grep for exactly these, as nvct.oci.runtime records them."""
    names = ["\\", VISIBLE_DEVICES, CUDA_VERSION, DEVICE_LIST_ROOT]
    names += [s.strip() for s in str(config.swarm_resource or "").split(",") if s.strip()]
    names += [str(p) for p in config.cdi_annotation_prefixes or ()]
    return names


def env_to_dict(env: Sequence[str] | None) -> dict[str, str]:
    """OCI ``process.env`` (``K=V`` strings) as a dict; the last one wins, as in the kernel."""
    out: dict[str, str] = {}
    for item in env or ():
        if not isinstance(item, str):
            continue
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out


def is_privileged(spec: Mapping[str, Any]) -> bool:
    """CAP_SYS_ADMIN in the bounding set; old specs give capabilities as a flat list."""
    caps = (spec.get("process") or {}).get("capabilities")
    if isinstance(caps, list):
        return "CAP_SYS_ADMIN" in caps
    if isinstance(caps, dict):
        return "CAP_SYS_ADMIN" in (caps.get("bounding") or ())
    return False


def from_spec(spec: Mapping[str, Any], config: Config) -> Request:
    """Read the request from an OCI spec (config.json) under ``config``."""
    process = spec.get("process") or {}
    env = env_to_dict(process.get("env"))
    return from_env(
        env,
        config,
        privileged=is_privileged(spec),
        mounts=spec.get("mounts") or (),
        annotations=spec.get("annotations") or {},
    )


def from_env(env: Mapping[str, str], config: Config, *, privileged: bool = False,
             mounts: Sequence[Mapping[str, Any]] = (),
             annotations: Mapping[str, str] | None = None) -> Request:
    """Read the request from a container's environment and spec parts."""
    legacy = bool(env.get(CUDA_VERSION)) and not env.get(REQUIRE_CUDA)
    devices, source = _visible_devices(env, config, privileged, mounts, annotations or {}, legacy)
    if devices is None:
        return Request(devices=None, privileged=privileged, legacy_image=legacy, env=env)
    mig_config = _privileged_list(env, MIG_CONFIG_DEVICES, privileged)
    mig_monitor = _privileged_list(env, MIG_MONITOR_DEVICES, privileged)
    disable_require = bool(config.disable_require) or _parse_bool(env.get("NVIDIA_DISABLE_REQUIRE"))
    return Request(
        devices=devices,
        capabilities=_capabilities(env, config, legacy),
        requirements=_requirements(env, disable_require),
        disable_require=disable_require,
        mig_config=mig_config,
        mig_monitor=mig_monitor,
        imex_channels=_imex_channels(env, config, privileged, mounts),
        features=frozenset(name for var, name in GATED_FEATURES.items() if env.get(var) == "enabled"),
        privileged=privileged,
        legacy_image=legacy,
        source=source,
        env=env,
    )


def is_qualified_cdi_name(name: str) -> bool:
    """``vendor.com/class=device``, by the CDI library's rules (nvct.request.cdinames)."""
    from nvct.request.cdinames import is_qualified

    return is_qualified(name)


def _visible_devices(env, config, privileged, mounts, annotations, legacy):
    devices, source = _requested_devices(env, config, privileged, mounts, annotations, legacy)
    if devices:
        _check_gated_kinds(devices, source, privileged, config)
    return devices, source


def _requested_devices(env, config, privileged, mounts, annotations, legacy):
    from_annotations = _devices_from_annotations(annotations, config)
    if from_annotations:
        if not (privileged or config.accept_envvar_unprivileged):
            # Annotations are spec content like the env (podman copies an image's
            # annotations; CRI can pass a pod's): with the env locked down for
            # unprivileged containers, so are they. Volume mounts stay the channel.
            from nvct.base.log import logger

            logger.warning("ignoring CDI device annotations in unprivileged container "
                           "(accept-nvidia-visible-devices-envvar-when-unprivileged = false)")
        else:
            return _normalize(from_annotations, "annotations"), "annotations"
    if config.accept_volume_mounts:
        from_mounts = [
            name for d in _mount_requests(mounts) if not d.startswith("imex/") if (name := _mount_request_to_name(d))
        ]
        if from_mounts:
            return _normalize(from_mounts, "volume mounts"), "mounts"
    names = _visible_env_vars(env, config)
    is_set = any(n in env for n in names)
    ids = _split_ids(",".join(env.get(n, "") for n in names if n in env))
    if not is_set and not ids and legacy:
        ids = ["all"]
    devices = _normalize(ids, "/".join(names))
    if devices is None:
        return None, "env"
    if not (privileged or config.accept_envvar_unprivileged):
        from nvct.base.log import logger

        logger.warning("ignoring %s in unprivileged container "
                       "(accept-nvidia-visible-devices-envvar-when-unprivileged = false)", "/".join(names))
        return None, "env"
    if any(d.rstrip("/") == DEVICE_LIST_ROOT or d.startswith(DEVICE_LIST_ROOT + "/") for d in devices):
        raise RequestError(_device_list_as_mounts("/".join(names), config))
    return devices, "env"


def _device_list_as_mounts(var: str, config) -> str:
    """The plugin's volume-mounts strategy put the device list's directory into the env."""
    said = f"{var}={DEVICE_LIST_ROOT} means the GPUs are listed as volume mounts"
    if not config.accept_volume_mounts:
        return f"{said}, which this config ignores: set accept-nvidia-visible-devices-as-volume-mounts = true"
    return f"{said}, but the container has no volume mount under {DEVICE_LIST_ROOT}"


#: CDI vendors whose devices only a privileged container (CAP_SYS_ADMIN) may name:
#: the management devices carry the MIG config/monitor capabilities, which
#: NVIDIA_MIG_CONFIG_DEVICES/NVIDIA_MIG_MONITOR_DEVICES refuse to others.
PRIVILEGED_VENDORS = ("management.nvidia.com",)


def _check_gated_kinds(devices, source, privileged, config) -> None:
    """Who may ask for which CDI kind (docs/security.md, "Who may request which device").

    An unprivileged container may name, through the env or annotations, only
    NVIDIA GPU kinds (vendor nvidia.com or a subdomain of it, and the
    configured default kind); another vendor's device (which may bind-mount
    any host directory) and the management devices need CAP_SYS_ADMIN.
    Volume mounts, which only the orchestrator sets, may name any vendor but
    not the management devices.
    """
    if privileged:
        return
    default_vendor = str(config.cdi_default_kind
                         or "nvidia.com/gpu").partition("/")[0]
    where = {"env": VISIBLE_DEVICES, "mounts": "volume mounts"}.get(source, source)
    for name in devices:
        if "=" not in name or "/" not in name.partition("=")[0]:
            continue  # an id, not a CDI name: the default kind
        vendor = name.partition("/")[0]
        if vendor in PRIVILEGED_VENDORS:
            raise RequestError(f"{where}: CDI device {name!r} is for privileged containers "
                               "only (needs CAP_SYS_ADMIN)")
        if source == "mounts" or vendor == default_vendor or vendor == "nvidia.com" \
                or vendor.endswith(".nvidia.com"):
            continue
        raise RequestError(f"{where}: CDI device {name!r} is not an NVIDIA device; an unprivileged "
                           "container may only request NVIDIA GPUs this way (needs CAP_SYS_ADMIN)")


def _visible_env_vars(env, config) -> list[str]:
    """``swarm-resource`` names env vars that take precedence over NVIDIA_VISIBLE_DEVICES."""
    swarm = [s.strip() for s in str(config.swarm_resource or "").split(",") if s.strip()]
    present = [s for s in swarm if s in env]
    return present or [VISIBLE_DEVICES]


def _normalize(ids: Sequence[str], where: str) -> tuple[str, ...] | None:
    """Apply all/none/void: the first of them in the list wins, ``void`` anywhere wins.

    Repeated ids are dropped (the reference turns ``0,0`` into an empty id).
    """
    ids = [i.strip() for i in ids if i.strip()]
    if len(ids) > _MAX_DEVICE_IDS:
        raise RequestError(f"{where}: too many device ids ({len(ids)})")
    for i in ids:
        if not i.isascii() or not i.isprintable():
            raise RequestError(f"{where}: invalid value {i!r} (ids and CDI names are ASCII)")
    if not ids or "void" in ids:
        return None
    for i in ids:
        if i == "all":
            return ("all",)
        if i == "none":
            return ()
    return tuple(dict.fromkeys(ids))


def _split_ids(value: str) -> list[str]:
    return [i.strip() for i in value.split(",") if i.strip()]


def _devices_from_annotations(annotations: Mapping[str, str], config: Config) -> list[str]:
    prefixes = config.cdi_annotation_prefixes or ()
    keys = sorted(k for k in annotations if any(k.startswith(p) for p in prefixes))
    out: list[str] = []
    for key in keys:
        out.extend(_split_ids(str(annotations[key])))
    return out


def _mount_requests(mounts: Sequence[Mapping[str, Any]]) -> list[str]:
    """Device requests given as ``/dev/null`` mounts under DEVICE_LIST_ROOT."""
    seen: set[str] = set()
    out: list[str] = []
    for m in mounts:
        if not isinstance(m, dict) or os.path.normpath(str(m.get("source", ""))) != "/dev/null":
            continue
        dest = os.path.normpath(str(m.get("destination", "")))
        if dest in seen:
            continue
        seen.add(dest)
        if not dest.startswith(DEVICE_LIST_ROOT + "/"):
            continue
        device = dest[len(DEVICE_LIST_ROOT):].strip("/")
        if device:
            out.append(device)
    return out


def _mount_request_to_name(device: str) -> str | None:
    """``cdi/vendor/class/name`` (or ``cdi/<qualified>``) to a qualified CDI name."""
    if not device.startswith("cdi/"):
        return device
    rest = device[len("cdi/"):]
    if is_qualified_cdi_name(rest):
        return rest
    parts = rest.split("/", 2)
    if len(parts) != 3:
        from nvct.base.log import logger

        logger.warning("ignoring invalid CDI device mount request %s", device)
        return None
    return f"{parts[0]}/{parts[1]}={parts[2]}"


def _imex_channels(env, config, privileged, mounts) -> tuple[str, ...]:
    if config.ignore_imex_channel_requests:
        return ()
    if config.accept_volume_mounts:
        mounted = [d[len("imex/"):] for d in _mount_requests(mounts) if d.startswith("imex/")]
        if mounted:
            return _checked_channels(dict.fromkeys(mounted), "IMEX channel volume mount")
    if IMEX_CHANNELS not in env:
        return ()
    channels = _normalize(_split_ids(env[IMEX_CHANNELS]), IMEX_CHANNELS)
    if not channels or channels == ("all",):
        # The reference ignores "all" for IMEX channels: there is no channel list to expand.
        return ()
    if not (privileged or config.accept_envvar_unprivileged):
        return ()
    return _checked_channels(channels, IMEX_CHANNELS)


_MAX_IMEX_CHANNEL = 1 << 20  # the driver's channel minors are far below this


def _checked_channels(channels, where: str) -> tuple[str, ...]:
    """Channel numbers in ASCII digits only: str.isdigit() also takes '²' and '٣'."""
    for c in channels:
        if not is_ascii_number(c) or int(c) >= _MAX_IMEX_CHANNEL:
            raise RequestError(f"{where}: invalid channel {c!r} (expected a number 0-{_MAX_IMEX_CHANNEL - 1})")
    return tuple(str(int(c)) for c in channels)


def is_ascii_number(text: str) -> bool:
    """Only the digits 0-9 (``str.isdigit`` accepts superscripts and other scripts' digits)."""
    return bool(text) and text.isascii() and text.isdigit()


def _privileged_list(env: Mapping[str, str], name: str, privileged: bool) -> tuple[str, ...]:
    value = env.get(name, "")
    if not value:
        return ()
    if not privileged:
        raise RequestError(f"{name} is set but the container is not privileged (needs CAP_SYS_ADMIN)")
    return tuple(dict.fromkeys(_split_ids(value)))


def _capabilities(env: Mapping[str, str], config: Config, legacy: bool) -> tuple[str, ...]:
    supported = config.supported_capabilities
    if DRIVER_CAPABILITIES not in env:
        if legacy:
            return tuple(sorted(supported))
        return tuple(c for c in DEFAULT_CAPABILITIES if c in supported)
    raw = env[DRIVER_CAPABILITIES]
    requested = _split_ids(raw)
    if not requested:
        return tuple(c for c in DEFAULT_CAPABILITIES if c in supported)
    if "all" in requested:
        return tuple(sorted(supported))
    for cap in requested:
        if cap not in ALL_CAPABILITIES:
            raise RequestError(
                f"{DRIVER_CAPABILITIES}: unknown capability {cap!r} "
                f"(known: all, {', '.join(ALL_CAPABILITIES)})"
            )
        if cap not in supported:
            raise RequestError(
                f"{DRIVER_CAPABILITIES}: capability {cap!r} is not in this node's "
                f"supported-driver-capabilities ({', '.join(supported)})"
            )
    return tuple(sorted(set(requested)))


def _requirements(env: Mapping[str, str], disable: bool) -> tuple[tuple[str, str], ...]:
    """The raw (name, expression) pairs; parsed and checked against the driver later."""
    if not env.get(CUDA_VERSION) and not any(k.startswith("NVIDIA_REQUIRE_") for k in env):
        return ()
    from nvct.request import requirements

    return tuple(requirements.collect(env, disable_require=disable))


def _parse_bool(value: str | None) -> bool:
    if value is None:
        return False  # unset, as on most starts: not even the parser's import
    from nvct.request.requirements import is_true

    return is_true(value)
