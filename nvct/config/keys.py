"""The one table of config.toml keys: each key's typed accessor, default and the reference's example.

:class:`Settings` lists every key anyone has given a meaning, one row each:
``accessor: Key[type] = Key("dotted.name", default, example=...)``, or
``Feature("name")`` for a ``[features]`` flag. A new key is one new row. From the rows come

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
    from typing import Any, Generic, Mapping, TypeVar, overload

    _T = TypeVar("_T")

    class _Typed(Generic[_T]):
        __slots__ = ()
else:
    _T = None

    class _Typed:
        """``Key[str]`` at run time: the class itself (the type is for type checkers)."""

        __slots__ = ()

        def __class_getitem__(cls, item):
            return cls

#: A key with no built-in value: left out of :func:`defaults`.
ABSENT = None

ALL_CAPABILITIES = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")


class Key(_Typed[_T]):
    """One dotted key; as a class attribute of :class:`Settings`, its accessor.

    On a Config it reads the key's value (file over defaults; None where neither
    sets it); on the class it is the row itself (``Config.cli_root.name``, for messages).
    """

    __slots__ = ("name", "default", "example", "attr")
    name: str
    default: Any  # ABSENT: none built in
    example: Any  # ABSENT: none
    attr: str  # the accessor's name

    def __init__(self, name: str, default: Any = ABSENT, example: Any = ABSENT):
        self.name, self.default, self.example, self.attr = name, default, example, ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    if TYPE_CHECKING:
        @overload
        def __get__(self, config: None, owner: Any = None) -> Key[_T]: ...
        @overload
        def __get__(self, config: object, owner: Any = None) -> _T: ...
        def __get__(self, config: Any, owner: Any = None) -> Any: ...
    else:
        def __get__(self, config, owner=None):
            if config is None:
                return self
            return config.get(self.name)

    def __set__(self, config: object, value: object) -> None:
        raise AttributeError(f"{self.name}: set in the config's data, not on the Config")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Feature(Key[bool]):
    """A ``[features]`` flag: reads as a bool, off unless set. ``settable``: the reference's current flags."""

    __slots__ = ("settable",)

    def __init__(self, name: str, settable: bool = True):
        super().__init__("features." + name)
        self.settable = settable

    if not TYPE_CHECKING:
        def __get__(self, config, owner=None):
            if config is None:
                return self
            return config.feature(self.name[len("features."):])


class Settings:
    """The table: every key, as the typed accessor :class:`nvct.config.file.Config` inherits."""

    __slots__ = ()

    accept_volume_mounts: Key[bool] = Key("accept-nvidia-visible-devices-as-volume-mounts", False, example=False)
    accept_envvar_unprivileged: Key[bool] = Key("accept-nvidia-visible-devices-envvar-when-unprivileged", True,
                                                example=True)
    # Two keys only an old template carried:
    alpha_merge_visible_devices_envvars: Key[bool | None] = Key("alpha-merge-visible-devices-envvars")
    disable_require: Key[bool] = Key("disable-require", False)
    look_for_volume_mounts_under: Key[str | None] = Key("look-for-nvidia-visible-devices-as-volume-mounts-under")
    supported_driver_capabilities: Key[str] = Key("supported-driver-capabilities", ",".join(ALL_CAPABILITIES))
    swarm_resource: Key[str] = Key("swarm-resource", "", example="DOCKER_RESOURCE_GPU")

    cli_root: Key[str] = Key("nvidia-container-cli.root", "", example="/run/nvidia/driver")
    cli_path: Key[str] = Key("nvidia-container-cli.path", "", example="/usr/bin/nvidia-container-cli")
    cli_environment: Key[list] = Key("nvidia-container-cli.environment", [])
    cli_debug: Key[str] = Key("nvidia-container-cli.debug", "", example="/var/log/nvidia-container-toolkit.log")
    cli_ldcache: Key[str] = Key("nvidia-container-cli.ldcache", "", example="/etc/ld.so.cache")
    cli_load_kmods: Key[bool] = Key("nvidia-container-cli.load-kmods", True)
    cli_no_pivot: Key[bool | None] = Key("nvidia-container-cli.no-pivot")
    cli_no_cgroups: Key[bool] = Key("nvidia-container-cli.no-cgroups", False, example=False)
    cli_user: Key[str] = Key("nvidia-container-cli.user", "", example="root:video")
    cli_ldconfig: Key[str] = Key("nvidia-container-cli.ldconfig", "@/sbin/ldconfig")

    runtime_debug: Key[str] = Key("nvidia-container-runtime.debug", "/dev/null",
                                  example="/var/log/nvidia-container-runtime.log")
    runtime_log_level: Key[str] = Key("nvidia-container-runtime.log-level", "info")
    runtimes: Key[list] = Key("nvidia-container-runtime.runtimes", ["runc", "crun"])
    mode: Key[str] = Key("nvidia-container-runtime.mode", "auto")
    runtime_experimental: Key[bool | None] = Key("nvidia-container-runtime.experimental")
    runtime_discover_mode: Key[str | None] = Key("nvidia-container-runtime.discover-mode")
    runtime_mknod_only: Key[bool | None] = Key("nvidia-container-runtime.mknod-only")
    csv_mount_spec_path: Key[str] = Key("nvidia-container-runtime.modes.csv.mount-spec-path",
                                        "/etc/nvidia-container-runtime/host-files-for-container.d")
    csv_compat_container_root: Key[str | None] = Key("nvidia-container-runtime.modes.csv.compat-container-root")
    cdi_spec_dirs: Key[list] = Key("nvidia-container-runtime.modes.cdi.spec-dirs", ["/etc/cdi", "/var/run/cdi"])
    cdi_default_kind: Key[str] = Key("nvidia-container-runtime.modes.cdi.default-kind", "nvidia.com/gpu")
    cdi_annotation_prefixes: Key[list] = Key("nvidia-container-runtime.modes.cdi.annotation-prefixes", ["cdi.k8s.io/"])
    jit_cdi_feature_flags: Key[list | None] = Key("nvidia-container-runtime.modes.jit-cdi.nvcdi-feature-flags")
    jit_cdi_disable_hooks: Key[list | None] = Key("nvidia-container-runtime.modes.jit-cdi.nvcdi-disable-hooks")
    jit_cdi_load_kernel_modules: Key[list | None] = Key("nvidia-container-runtime.modes.jit-cdi.load-kernel-modules")
    legacy_cuda_compat_mode: Key[str] = Key("nvidia-container-runtime.modes.legacy.cuda-compat-mode", "ldconfig")

    hook_path: Key[str] = Key("nvidia-container-runtime-hook.path", "nvidia-container-runtime-hook")
    hook_skip_mode_detection: Key[bool] = Key("nvidia-container-runtime-hook.skip-mode-detection", False)

    ctk_path: Key[str] = Key("nvidia-ctk.path", "nvidia-ctk")

    allow_cuda_compat_libs_from_container: Feature = Feature("allow-cuda-compat-libs-from-container")
    allow_ldconfig_from_container: Feature = Feature("allow-ldconfig-from-container")
    allow_unknown_oci_spec_fields: Feature = Feature("allow-unknown-oci-spec-fields")
    disable_cuda_compat_lib_hook: Feature = Feature("disable-cuda-compat-lib-hook")
    disable_imex_channel_creation: Feature = Feature("disable-imex-channel-creation")
    ignore_imex_channel_requests: Feature = Feature("ignore-imex-channel-requests")
    no_additional_gids_for_device_nodes: Feature = Feature("no-additional-gids-for-device-nodes")
    feature_gds: Feature = Feature("gds", settable=False)
    feature_mofed: Feature = Feature("mofed", settable=False)
    feature_nvswitch: Feature = Feature("nvswitch", settable=False)
    feature_gdrcopy: Feature = Feature("gdrcopy", settable=False)
    include_persistenced_socket: Feature = Feature("include-persistenced-socket", settable=False)
    include_gsp_firmware: Feature = Feature("include-gsp-firmware", settable=False)
    require_nvidia_kernel_module: Feature = Feature("require-nvidia-kernel-module", settable=False)

    nvct_dev_root: Key[str] = Key("nvct.dev-root", "", example="/")
    nvct_proc_root: Key[str] = Key("nvct.proc-root", "", example="/proc")
    nvct_path: Key[str] = Key("nvct.path", "", example="/usr/bin/nvct")
    sandbox: Key[str | None] = Key("nvct.sandbox")


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


#: :func:`_known`, built on first use (a container start whose file holds only keys of the defaults never needs it).
_KNOWN: list[dict] = []


def unknown(data: Mapping[str, object]) -> list[str]:
    """The dotted keys of ``data`` (a parsed config.toml) that no release gives a meaning, in file order."""
    if not _KNOWN:
        _KNOWN.append(_known())
    out: list[str] = []
    _walk(data, _KNOWN[0], "", out)
    return out


def warning(path: str | None, keys: list[str]) -> str:
    """The one line that names them."""
    names = ", ".join(repr(k) for k in keys)
    return (f"{path or 'config'}: unknown key{'s' if len(keys) > 1 else ''} {names} ignored "
            f"(a typo? 'nvct config default' lists every key)")


def _walk(table: Mapping[str, object], known: dict, prefix: str, out: list[str]) -> None:
    for name, value in table.items():
        if name not in known:
            out.append(prefix + name)
        elif isinstance(value, dict) and isinstance(known[name], dict):
            _walk(value, known[name], f"{prefix}{name}.", out)


def _copy(value):
    # A list default is the table's own: each caller gets a copy.
    return list(value) if isinstance(value, list) else value
