"""The one table of config.toml keys: each key's typed accessor, default and the reference's example.

:class:`Settings` lists every key anyone has given a meaning, one line each:
``accessor: type = key("dotted.name", default, example=...)``. From it come

* the typed accessors of :class:`nvct.config.file.Config` (a subclass): ``config.cli_load_kmods``;
* :func:`defaults`, the built-in config (a key without a default is left out of it, as the reference does);
* :func:`examples`, the settings ``nvct config default`` writes commented out;
* :func:`feature_flags`, the ``[features]`` flags ``nvct config --set`` accepts;
* :func:`unknown`, the keys of a file that no release gives a meaning (a typo: warned about, never refused).

The keys are the union of every release of the reference's config struct (its
``toml`` tags, including keys it has since dropped, and the keys its shipped
config.toml templates carried) and nvct's own ``[nvct]`` table. A key outside
it is most likely a typo; it is still accepted, because a newer reference
release may add keys that must keep working here. An accessor returns the
value as the file (over the defaults) has it, None where neither sets it;
``Config`` adds what a key alone does not say (``driver_root`` with its
environment override, ``supported_capabilities`` parsed).

The shim reads the config on every container start: this module imports
nothing, and the table is built once, at import.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

#: A key with no built-in value: left out of :func:`defaults`.
ABSENT = None

ALL_CAPABILITIES = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")


class Key:
    """One dotted key; as a class attribute of a :class:`Settings`, its accessor."""

    __slots__ = ("name", "default", "example", "attr")

    def __init__(self, name: str, default: object = ABSENT, example: object = ABSENT):
        self.name, self.default, self.example, self.attr = name, default, example, ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, config, owner=None):
        if config is None:
            return self  # Config.cli_root.name: the key's name, for messages
        return config.get(self.name)

    def __set__(self, config, value) -> None:
        raise AttributeError(f"{self.name}: set in the config's data, not on the Config")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Feature(Key):
    """A ``[features]`` flag: reads as a bool, off unless set. ``settable``: the reference's current flags."""

    __slots__ = ("settable",)

    def __init__(self, name: str, settable: bool = True):
        super().__init__("features." + name)
        self.settable = settable

    def __get__(self, config, owner=None):
        if config is None:
            return self
        return config.feature(self.name[len("features."):])


def key(name: str, default: object = ABSENT, example: object = ABSENT) -> Any:
    """A row of the table (typed as its accessor's value for type checkers)."""
    return Key(name, default, example)


def feature(name: str, settable: bool = True) -> Any:
    """A ``[features]`` row; ``settable=False``: a flag only older reference releases knew."""
    return Feature(name, settable)


class Settings:
    """The table: every key, as the typed accessor :class:`nvct.config.file.Config` inherits."""

    __slots__ = ()

    accept_volume_mounts: bool = key("accept-nvidia-visible-devices-as-volume-mounts", False, example=False)
    accept_envvar_unprivileged: bool = key("accept-nvidia-visible-devices-envvar-when-unprivileged", True,
                                           example=True)
    alpha_merge_visible_devices_envvars: bool | None = key("alpha-merge-visible-devices-envvars")  # an old template's
    disable_require: bool = key("disable-require", False)
    look_for_volume_mounts_under: str | None = key("look-for-nvidia-visible-devices-as-volume-mounts-under")  # an old template's
    supported_driver_capabilities: str = key("supported-driver-capabilities", ",".join(ALL_CAPABILITIES))
    swarm_resource: str = key("swarm-resource", "", example="DOCKER_RESOURCE_GPU")

    cli_root: str = key("nvidia-container-cli.root", "", example="/run/nvidia/driver")
    cli_path: str = key("nvidia-container-cli.path", "", example="/usr/bin/nvidia-container-cli")
    cli_environment: list = key("nvidia-container-cli.environment", [])
    cli_debug: str = key("nvidia-container-cli.debug", "", example="/var/log/nvidia-container-toolkit.log")
    cli_ldcache: str = key("nvidia-container-cli.ldcache", "", example="/etc/ld.so.cache")
    cli_load_kmods: bool = key("nvidia-container-cli.load-kmods", True)
    cli_no_pivot: bool | None = key("nvidia-container-cli.no-pivot")
    cli_no_cgroups: bool = key("nvidia-container-cli.no-cgroups", False, example=False)
    cli_user: str = key("nvidia-container-cli.user", "", example="root:video")
    cli_ldconfig: str = key("nvidia-container-cli.ldconfig", "@/sbin/ldconfig")

    runtime_debug: str = key("nvidia-container-runtime.debug", "/dev/null",
                             example="/var/log/nvidia-container-runtime.log")
    runtime_log_level: str = key("nvidia-container-runtime.log-level", "info")
    runtimes: list = key("nvidia-container-runtime.runtimes", ["runc", "crun"])
    mode: str = key("nvidia-container-runtime.mode", "auto")
    runtime_experimental: bool | None = key("nvidia-container-runtime.experimental")
    runtime_discover_mode: str | None = key("nvidia-container-runtime.discover-mode")
    runtime_mknod_only: bool | None = key("nvidia-container-runtime.mknod-only")
    csv_mount_spec_path: str = key("nvidia-container-runtime.modes.csv.mount-spec-path",
                                   "/etc/nvidia-container-runtime/host-files-for-container.d")
    csv_compat_container_root: str | None = key("nvidia-container-runtime.modes.csv.compat-container-root")
    cdi_spec_dirs: list = key("nvidia-container-runtime.modes.cdi.spec-dirs", ["/etc/cdi", "/var/run/cdi"])
    cdi_default_kind: str = key("nvidia-container-runtime.modes.cdi.default-kind", "nvidia.com/gpu")
    cdi_annotation_prefixes: list = key("nvidia-container-runtime.modes.cdi.annotation-prefixes", ["cdi.k8s.io/"])
    jit_cdi_feature_flags: list | None = key("nvidia-container-runtime.modes.jit-cdi.nvcdi-feature-flags")
    jit_cdi_disable_hooks: list | None = key("nvidia-container-runtime.modes.jit-cdi.nvcdi-disable-hooks")
    jit_cdi_load_kernel_modules: list | None = key("nvidia-container-runtime.modes.jit-cdi.load-kernel-modules")
    legacy_cuda_compat_mode: str = key("nvidia-container-runtime.modes.legacy.cuda-compat-mode", "ldconfig")

    hook_path: str = key("nvidia-container-runtime-hook.path", "nvidia-container-runtime-hook")
    hook_skip_mode_detection: bool = key("nvidia-container-runtime-hook.skip-mode-detection", False)

    ctk_path: str = key("nvidia-ctk.path", "nvidia-ctk")

    allow_cuda_compat_libs_from_container: bool = feature("allow-cuda-compat-libs-from-container")
    allow_ldconfig_from_container: bool = feature("allow-ldconfig-from-container")
    allow_unknown_oci_spec_fields: bool = feature("allow-unknown-oci-spec-fields")
    disable_cuda_compat_lib_hook: bool = feature("disable-cuda-compat-lib-hook")
    disable_imex_channel_creation: bool = feature("disable-imex-channel-creation")
    ignore_imex_channel_requests: bool = feature("ignore-imex-channel-requests")
    no_additional_gids_for_device_nodes: bool = feature("no-additional-gids-for-device-nodes")
    feature_gds: bool = feature("gds", settable=False)
    feature_mofed: bool = feature("mofed", settable=False)
    feature_nvswitch: bool = feature("nvswitch", settable=False)
    feature_gdrcopy: bool = feature("gdrcopy", settable=False)
    include_persistenced_socket: bool = feature("include-persistenced-socket", settable=False)
    include_gsp_firmware: bool = feature("include-gsp-firmware", settable=False)
    require_nvidia_kernel_module: bool = feature("require-nvidia-kernel-module", settable=False)

    nvct_dev_root: str = key("nvct.dev-root", "", example="/")
    nvct_proc_root: str = key("nvct.proc-root", "", example="/proc")
    nvct_path: str = key("nvct.path", "", example="/usr/bin/nvct")
    sandbox: str | None = key("nvct.sandbox")


#: Every row, in table order.
KEYS: tuple[Key, ...] = tuple(v for v in vars(Settings).values() if isinstance(v, Key))


def defaults() -> dict:
    """The built-in config, nested as the file is: every key with a default (``[features]``: none set)."""
    out: dict = {}
    for row in KEYS:
        if row.default is ABSENT and not isinstance(row, Feature):
            continue
        *tables, name = row.name.split(".")
        node = out
        for table in tables:
            node = node.setdefault(table, {})
        if row.default is not ABSENT:
            node[name] = _copy(row.default)
    return out


def examples() -> dict:
    """Settings written commented out, with an example value, unless set (the reference's list)."""
    return {row.name: row.example for row in KEYS if row.example is not ABSENT}


def feature_flags() -> tuple[str, ...]:
    """The ``[features]`` flags the reference knows today (each a boolean)."""
    return tuple(row.name[len("features."):] for row in KEYS if isinstance(row, Feature) and row.settable)


def _known() -> dict:
    # A table's keys; a nested dict is a sub-table, None a setting.
    out: dict = {}
    for row in KEYS:
        *tables, name = row.name.split(".")
        node = out
        for table in tables:
            node = node.setdefault(table, {})
        node[name] = None
    return out


_KNOWN = _known()


def unknown(data: dict) -> list[str]:
    """The dotted keys of ``data`` (a parsed config.toml) that no release gives a meaning, in file order."""
    out: list[str] = []
    _walk(data, _KNOWN, "", out)
    return out


def warning(path: str | None, keys: list[str]) -> str:
    """The one line that names them."""
    names = ", ".join(repr(k) for k in keys)
    return (f"{path or 'config'}: unknown key{'s' if len(keys) > 1 else ''} {names} ignored "
            f"(a typo? 'nvct config default' lists every key)")


def _walk(table: dict, known: dict, prefix: str, out: list[str]) -> None:
    for name, value in table.items():
        if name not in known:
            out.append(prefix + name)
        elif isinstance(value, dict) and isinstance(known[name], dict):
            _walk(value, known[name], f"{prefix}{name}.", out)


def _copy(value):
    # A list default is the table's own: each caller gets a copy.
    return list(value) if isinstance(value, list) else value
