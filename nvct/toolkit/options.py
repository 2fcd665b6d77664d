"""Everything ``nvct toolkit install`` is told, with the reference installer's defaults.

The CLI (:mod:`nvct.cli.toolkit`) fills this in from flags and environment
variables; :meth:`Options.resolved` applies the per-engine defaults
(config file, socket, restart mode) and checks combinations, so code and
tests can build an :class:`Options` directly.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from nvct.base.errors import ConfigError

DEFAULT_INSTALL_DIR = "/usr/local/nvidia"
DEFAULT_PID_FILE = "/run/nvidia/toolkit/toolkit.pid"
DEFAULT_DRIVER_ROOT = "/run/nvidia/driver"
DEFAULT_HOST_ROOT = "/host"
#: ``--python``'s default: the toolkit carries its own Python (nvct.toolkit.python); a path means
#: the host's python3 instead (3.9+).
BUNDLED_PYTHON = "bundled"
DEFAULT_PYTHON = BUNDLED_PYTHON
DEFAULT_CDI_OUTPUT_DIR = "/var/run/cdi"
DEFAULT_CDI_KIND = "management.nvidia.com/gpu"
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"
RESTART_MODES = ("signal", "systemd", "none")

#: Per engine: main config, socket, restart mode, systemd unit (as the reference).
ENGINE_DEFAULTS = {
    "docker": ("/etc/docker/daemon.json", "/var/run/docker.sock", "signal", "docker"),
    "containerd": ("/etc/containerd/config.toml", "/run/containerd/containerd.sock", "signal", "containerd"),
    "crio": ("/etc/crio/crio.conf", "/var/run/crio/crio.sock", "systemd", "crio"),
}


@dataclass
class Options:
    # --- the installer ---
    install_dir: str = DEFAULT_INSTALL_DIR
    pid_file: str = DEFAULT_PID_FILE
    no_daemon: bool = False
    no_runtime_config: bool = False
    python: str = DEFAULT_PYTHON
    host_root: str = DEFAULT_HOST_ROOT

    # --- the installed config.toml ---
    driver_root: str = DEFAULT_DRIVER_ROOT
    driver_root_ctr_path: str | None = None
    dev_root: str = ""  # empty: the driver root
    dev_root_ctr_path: str | None = None
    proc_root: str = ""
    runtime_mode: str | None = None
    runtime_debug: str | None = None
    runtime_log_level: str | None = None
    cdi_default_kind: str | None = None
    cdi_annotation_prefixes: list = field(default_factory=list)
    low_level_runtimes: list = field(default_factory=list)
    hook_skip_mode_detection: bool = True
    cli_debug: str | None = None
    accept_envvar_unprivileged: bool = True
    accept_volume_mounts: bool = False
    opt_in_features: list = field(default_factory=list)

    # --- CDI for management containers ---
    cdi_enabled: bool = False
    cdi_output_dir: str = DEFAULT_CDI_OUTPUT_DIR
    cdi_kind: str = DEFAULT_CDI_KIND
    create_device_nodes: list = field(default_factory=lambda: ["control"])

    # --- the container engine ---
    runtime: str = "docker"
    config: str | None = None
    drop_in_config: str | None = None
    drop_in_config_host_path: str | None = None
    executable_path: str | None = None
    socket: str | None = None
    runtime_pid_file: str | None = None
    restart_mode: str | None = None
    enable_cdi_in_runtime: bool | None = None
    runtime_name: str = "nvidia"
    set_as_default: bool = True
    config_sources: list = field(default_factory=lambda: ["command", "file"])
    runtime_type: str = "io.containerd.runc.v2"
    runtime_config_override: dict = field(default_factory=dict)
    use_legacy_config: bool = False
    crio_config_mode: str = "config"
    crio_hooks_dir: str = "/usr/share/containers/oci/hooks.d"
    crio_hook_filename: str = "oci-nvidia-hook.json"

    # --- the GPU Operator's NRI mode: a plugin instead of an engine config ---
    enable_nri_plugin: bool = False
    nri_socket: str = DEFAULT_NRI_SOCKET
    nri_plugin_index: int = 10
    nri_namespace: str = ""
    nri_management_namespaces: list = field(default_factory=list)
    #: How long to wait for dockerd to show a reloaded config.
    reload_timeout: float = 30.0
    #: Tries (and seconds between them) to reach the daemon's socket, which may not be up yet.
    signal_attempts: int = 6
    signal_backoff: float = 5.0

    @property
    def service(self) -> str:
        return ENGINE_DEFAULTS[self.runtime][3]

    @property
    def effective_dev_root(self) -> str:
        """The host's dev root: ``--dev-root``, else the driver root (the reference's rule)."""
        return self.dev_root or self.driver_root

    @property
    def bundled(self) -> bool:
        """The wrappers run the toolkit's own Python (not a host python3)."""
        return self.python in ("", BUNDLED_PYTHON)

    @property
    def nvidia_runtime_name(self) -> str:
        """``--runtime-name``, except that the per-mode names cannot be it (the reference's rule)."""
        return "nvidia" if self.runtime_name in ("nvidia-cdi", "nvidia-legacy") else self.runtime_name

    @property
    def config_source(self) -> str:
        """What nvct.engines can do with ``--config-source``: the first source that names one."""
        return self.config_sources[0]

    def seen_from_here(self, host_path: str) -> str:
        """Where the installer sees a host path: ``/`` is the host root; others are mounted as they are."""
        if os.path.normpath(host_path) == "/":
            return self.host_root or "/"
        return host_path

    def resolved(self) -> "Options":
        """A copy with per-engine defaults filled in; bad combinations are a ConfigError."""
        if self.runtime not in ENGINE_DEFAULTS:
            raise ConfigError(f"--runtime: unknown container engine {self.runtime!r} "
                              f"(expected one of {', '.join(ENGINE_DEFAULTS)})")
        config, socket, restart_mode, _ = ENGINE_DEFAULTS[self.runtime]
        out = dataclasses.replace(self)
        out.config = self.config or config
        out.socket = self.socket or socket
        out.restart_mode = self.restart_mode or restart_mode
        if not os.path.isdir(out.host_root or "/"):
            out.host_root = "/"  # not in a container, or the host's root is not mounted
        out.driver_root_ctr_path = self.driver_root_ctr_path or out.seen_from_here(self.driver_root)
        # No --dev-root: the driver root, as the reference's NVIDIA_DEV_ROOT (the config leaves it unset).
        out.dev_root_ctr_path = self.dev_root_ctr_path or (
            out.seen_from_here(self.dev_root) if self.dev_root else out.driver_root_ctr_path)
        if out.enable_cdi_in_runtime is None:
            out.enable_cdi_in_runtime = self.cdi_enabled
        if out.enable_nri_plugin:
            out.no_runtime_config = True  # the reference's noop configurer: no config written, no restart
        out._check()
        return out

    def _check(self) -> None:
        if not self.install_dir:
            raise ConfigError("--toolkit-install-dir must not be empty")
        for flag, path in (("--toolkit-install-dir", self.install_dir), ("--driver-root", self.driver_root),
                           ("--pid-file", self.pid_file), ("--config", self.config)):
            if not os.path.isabs(path):
                raise ConfigError(f"{flag}: {path!r} is not an absolute path")
        if self.restart_mode not in RESTART_MODES:
            raise ConfigError(f"--restart-mode: {self.restart_mode!r} is not one of {', '.join(RESTART_MODES)}")
        if self.runtime == "crio" and self.restart_mode == "signal":
            raise ConfigError("--restart-mode=signal: cri-o cannot be reloaded by a signal "
                              "(use systemd, its default, or none)")
        if self.runtime == "crio" and self.crio_config_mode not in ("config", "hook"):
            raise ConfigError(f"--config-mode: {self.crio_config_mode!r} is not one of config, hook")
        if self.use_legacy_config:
            raise ConfigError("--use-legacy-config: a version 1 containerd config is not created by nvct "
                              "(an existing one is edited as it is)")
        for source in self.config_sources:
            kind, eq, path = source.partition("=")
            if kind.strip() not in ("command", "file") or (eq and kind.strip() == "command"):
                raise ConfigError(f"--config-source: {source!r} is not supported (use command, file, file=PATH)")
            if eq and not os.path.isabs(path.strip()):
                raise ConfigError(f"--config-source: {source!r}: {path.strip()!r} is not an absolute path")
        if self.enable_nri_plugin:
            if not self.nri_namespace:
                raise ConfigError("--enable-nri-plugin: the NRI namespace must be set (--nri-namespace, NRI_NAMESPACE)")
            if not 0 <= self.nri_plugin_index <= 99:
                raise ConfigError(f"--nri-plugin-index: {self.nri_plugin_index} is not in 0..99")
            if not os.path.isabs(self.nri_socket):
                raise ConfigError(f"--nri-socket: {self.nri_socket!r} is not an absolute path")
        if not self.config_sources:
            raise ConfigError("--config-source: name at least one of command, file")
        for mode in self.create_device_nodes:
            if mode not in ("", "none", "control"):
                raise ConfigError(f"--create-device-nodes: {mode!r} is not one of control, none")
        if not isinstance(self.runtime_config_override, dict):
            raise ConfigError("--runtime-config-override: expected a JSON object")
