"""``nvct toolkit install``: the node installer, with the reference installer's flags and env vars.

Flags and environment variables are those of ``nvidia-ctk-installer`` (what
a GPU Operator DaemonSet sets), plus nvct's own (``--proc-root``,
``--python``, ``--runtime-pid-file``). Lists take commas or repeats. The work
is :func:`nvct.toolkit.run`; see docs/installer.md.
"""

from __future__ import annotations

import json
import os
import traceback

import click

from nvct.base.errors import ConfigError
from nvct.toolkit import options as defaults

_LISTS = ("cdi_annotation_prefixes", "low_level_runtimes", "opt_in_features", "create_device_nodes",
          "config_sources", "nri_management_namespaces")


def _opt(*names, env=None, **kwargs):
    """An option read from its flag, else its environment variables (the reference's names)."""
    envvars = [env] if isinstance(env, str) else list(env or [])
    return click.option(*names, envvar=envvars or None, show_envvar=bool(envvars), **kwargs)


_INSTALLER = [
    _opt("--no-daemon", "-n", "no_daemon", is_flag=True, env="NO_DAEMON",
         help="Install and exit, undoing nothing later."),
    _opt("--no-runtime-config", "no_runtime_config", is_flag=True, env="NO_RUNTIME_CONFIG",
         help="Install the toolkit only; leave the container engine's config alone."),
    _opt("--runtime", "-r", "runtime", type=click.Choice(sorted(defaults.ENGINE_DEFAULTS)), default="docker",
         show_default=True, env="RUNTIME", help="The container engine to configure."),
    _opt("--toolkit-install-dir", "--root", "install_dir", default=defaults.DEFAULT_INSTALL_DIR, show_default=True,
         metavar="DIR", env=["TOOLKIT_INSTALL_DIR", "ROOT"],
         help="The toolkit goes in DIR/toolkit; in a pod, mount DIR at the host's own path."),
    _opt("--pid-file", "pid_file", default=defaults.DEFAULT_PID_FILE, show_default=True, metavar="PATH",
         env=["TOOLKIT_PID_FILE", "PID_FILE"], help="Locked while the installer runs: one per node."),
    _opt("--host-root", "host_root", default=defaults.DEFAULT_HOST_ROOT, show_default=True, metavar="DIR",
         env="HOST_ROOT_MOUNT", help="Where the host's / is mounted (for systemctl and the python3 check; "
                                     "/ when it does not exist)."),
    _opt("--python", "python", default=defaults.DEFAULT_PYTHON, show_default=True, metavar="PATH",
         env="NVCT_HOST_PYTHON", help="What the installed wrappers run: 'bundled' (a Python copied into the toolkit "
              "directory: the host needs none), or the PATH of the host's python3 (3.9+)."),
    _opt("--debug", "debug", is_flag=True, env="TOOLKIT_DEBUG", help="Show tracebacks of unexpected errors."),
]

_TOOLKIT = [
    _opt("--driver-root", "--nvidia-driver-root", "driver_root", default=defaults.DEFAULT_DRIVER_ROOT,
         show_default=True, metavar="DIR", env=["NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"],
         help="The host path of the driver's files (/ for a driver installed on the host)."),
    _opt("--driver-root-ctr-path", "driver_root_ctr_path", metavar="DIR", env="DRIVER_ROOT_CTR_PATH",
         help="Where the installer sees the driver root (default: --host-root for /, else the same path)."),
    _opt("--dev-root", "dev_root", default="", metavar="DIR", env=["NVIDIA_DEV_ROOT", "DEV_ROOT"],
         help="The root of the host's /dev (default: --driver-root, as the reference's NVIDIA_DEV_ROOT)."),
    _opt("--dev-root-ctr-path", "dev_root_ctr_path", metavar="DIR", env="DEV_ROOT_CTR_PATH",
         help="Where the installer sees the dev root (default: --host-root for /, else the same path)."),
    _opt("--proc-root", "proc_root", default="", metavar="DIR", env="NVCT_PROC_ROOT",
         help="nvct: the host's /proc for the driver's files (default /proc)."),
    _opt("--nvidia-container-runtime.debug", "--nvidia-container-runtime-debug", "runtime_debug", metavar="PATH",
         env="NVIDIA_CONTAINER_RUNTIME_DEBUG", help="The runtime's debug log file."),
    _opt("--nvidia-container-runtime.log-level", "--nvidia-container-runtime-debug-log-level",
         "runtime_log_level", env="NVIDIA_CONTAINER_RUNTIME_LOG_LEVEL", help="The runtime's log level."),
    _opt("--nvidia-container-runtime.mode", "--nvidia-container-runtime-mode", "runtime_mode",
         env="NVIDIA_CONTAINER_RUNTIME_MODE", help="The `nvidia` runtime's mode (default auto)."),
    _opt("--nvidia-container-runtime.modes.cdi.default-kind", "cdi_default_kind",
         env="NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", help="CDI kind of bare device names."),
    _opt("--nvidia-container-runtime.modes.cdi.annotation-prefixes",
         "--nvidia-container-runtime-modes.cdi.annotation-prefixes", "cdi_annotation_prefixes", multiple=True,
         env="NVIDIA_CONTAINER_RUNTIME_MODES_CDI_ANNOTATION_PREFIXES",
         help="CDI annotation prefixes (containerd also passes PREFIX* through to the runtime)."),
    _opt("--nvidia-container-runtime.runtimes", "low_level_runtimes", multiple=True,
         env="NVIDIA_CONTAINER_RUNTIME_RUNTIMES",
         help="Low-level runtimes (default: the engine's default/runc/crun binaries, then runc, crun)."),
    _opt("--nvidia-container-runtime-hook.skip-mode-detection/--no-nvidia-container-runtime-hook.skip-mode-detection",
         "hook_skip_mode_detection", default=True,
         env="NVIDIA_CONTAINER_RUNTIME_HOOK_SKIP_MODE_DETECTION", help="The hook's skip-mode-detection."),
    _opt("--nvidia-container-cli.debug", "--nvidia-container-cli-debug", "cli_debug", metavar="PATH",
         env="NVIDIA_CONTAINER_CLI_DEBUG", help="The hook's debug log file."),
    _opt("--accept-nvidia-visible-devices-envvar-when-unprivileged/--no-accept-nvidia-visible-devices-envvar-when-unprivileged",
         "accept_envvar_unprivileged", default=True,
         env="ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED", help="Config setting of that name."),
    _opt("--accept-nvidia-visible-devices-as-volume-mounts", "accept_volume_mounts", is_flag=True,
         env="ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS", help="Config setting of that name."),
    _opt("--cdi-enabled", "--enable-cdi", "cdi_enabled", is_flag=True, env=["CDI_ENABLED", "ENABLE_CDI"],
         help="Write a management CDI spec, create the control device nodes, enable CDI in the engine."),
    _opt("--cdi-output-dir", "cdi_output_dir", default=defaults.DEFAULT_CDI_OUTPUT_DIR, show_default=True,
         metavar="DIR", env="CDI_OUTPUT_DIR", help="Where the management spec goes ('' for none)."),
    _opt("--cdi-kind", "cdi_kind", default=defaults.DEFAULT_CDI_KIND, show_default=True, env="CDI_KIND",
         help="The management spec's kind."),
    _opt("--create-device-nodes", "create_device_nodes", multiple=True, default=("control",), show_default=True,
         env="CREATE_DEVICE_NODES", help="With --cdi-enabled: control, or none."),
    _opt("--opt-in-features", "opt_in_features", multiple=True, hidden=True,
         env="NVIDIA_CONTAINER_TOOLKIT_OPT_IN_FEATURES"),
]

_ENGINE = [
    _opt("--config", "config", metavar="PATH", env=["RUNTIME_CONFIG", "CONTAINERD_CONFIG", "DOCKER_CONFIG"],
         help="The engine's config (default /etc/docker/daemon.json, /etc/containerd/config.toml, "
              "/etc/crio/crio.conf)."),
    _opt("--drop-in-config", "drop_in_config", metavar="PATH", env="RUNTIME_DROP_IN_CONFIG",
         help="containerd, cri-o: the drop-in file (default beside --config: conf.d/99-nvidia.toml, "
              "crio.conf.d/99-nvidia.toml; '' edits the main config)."),
    _opt("--drop-in-config-host-path", "drop_in_config_host_path", metavar="PATH",
         env="RUNTIME_DROP_IN_CONFIG_HOST_PATH", help="The drop-in's path on the host, for containerd's imports."),
    _opt("--executable-path", "executable_path", metavar="PATH", env="RUNTIME_EXECUTABLE_PATH",
         help="The engine's binary, for --config-source=command."),
    _opt("--socket", "socket", metavar="PATH", env=["RUNTIME_SOCKET", "CONTAINERD_SOCKET", "DOCKER_SOCKET"],
         help="The daemon's socket: its pid is found through it (default /var/run/docker.sock, "
              "/run/containerd/containerd.sock, /var/run/crio/crio.sock)."),
    _opt("--runtime-pid-file", "runtime_pid_file", metavar="PATH", env="RUNTIME_PID_FILE",
         help="nvct: read the daemon's pid from this file instead of asking its socket."),
    _opt("--restart-mode", "restart_mode", type=click.Choice(defaults.RESTART_MODES),
         env=["RUNTIME_RESTART_MODE", "CONTAINERD_RESTART_MODE", "DOCKER_RESTART_MODE", "CRIO_RESTART_MODE"],
         help="How the daemon picks the change up (default: signal; cri-o systemd)."),
    _opt("--enable-cdi-in-runtime/--no-enable-cdi-in-runtime", "enable_cdi_in_runtime", default=None,
         env="RUNTIME_ENABLE_CDI", help="Enable CDI in the engine (default: --cdi-enabled)."),
    _opt("--runtime-name", "--nvidia-runtime-name", "--runtime-class", "runtime_name", default="nvidia",
         show_default=True, env=["NVIDIA_RUNTIME_NAME", "CONTAINERD_RUNTIME_CLASS", "DOCKER_RUNTIME_NAME"],
         help="The name of the `nvidia` runtime."),
    _opt("--set-as-default/--no-set-as-default", "set_as_default", default=True,
         env=["NVIDIA_RUNTIME_SET_AS_DEFAULT", "CONTAINERD_SET_AS_DEFAULT", "DOCKER_SET_AS_DEFAULT"],
         help="Make the `nvidia` runtime the engine's default."),
    _opt("--config-source", "--config-sources", "config_sources", multiple=True, default=("command", "file"),
         show_default=True, env=["RUNTIME_CONFIG_SOURCES", "RUNTIME_CONFIG_SOURCE"],
         help="Read the engine's current settings from the daemon (command) or the file; the first wins, "
              "command falls back to the file."),
    _opt("--use-legacy-config", "use_legacy_config", is_flag=True, env="CONTAINERD_USE_LEGACY_CONFIG",
         help="Not supported by nvct (an existing version 1 config is edited as it is)."),
    _opt("--runtime-type", "runtime_type", default="io.containerd.runc.v2", show_default=True,
         env="CONTAINERD_RUNTIME_TYPE", help="containerd: runtime_type of the added runtimes."),
    _opt("--runtime-config-override", "runtime_config_override", default="{}", metavar="JSON",
         env=["RUNTIME_CONFIG_OVERRIDE", "CONTAINERD_RUNTIME_CONFIG_OVERRIDE"],
         help="containerd: JSON merged into each added runtime's table."),
    _opt("--config-mode", "crio_config_mode", default="config", show_default=True, env="CRIO_CONFIG_MODE",
         help="cri-o: config, or hook (an OCI hooks.d file; deprecated)."),
    _opt("--hooks-dir", "crio_hooks_dir", default="/usr/share/containers/oci/hooks.d", show_default=True,
         metavar="DIR", env="CRIO_HOOKS_DIR", help="cri-o hook mode: the hooks directory."),
    _opt("--hook-filename", "crio_hook_filename", default="oci-nvidia-hook.json", show_default=True,
         env="CRIO_HOOK_FILENAME", help="cri-o hook mode: the hook's file name."),
    _opt("--reload-timeout", "reload_timeout", type=float, default=30.0, hidden=True),
]

_NRI = [
    _opt("--enable-nri-plugin", "enable_nri_plugin", is_flag=True, env="ENABLE_NRI_PLUGIN",
         help="Write no engine config; register an NRI plugin that gives each container the CDI devices its "
              "pod annotation nvidia.cdi.k8s.io/container.<name> names (the GPU Operator's NRI mode)."),
    _opt("--nri-plugin-index", "nri_plugin_index", type=int, default=10, show_default=True, env="NRI_PLUGIN_INDEX",
         help="The plugin's NRI index (0-99): its place among the runtime's plugins."),
    _opt("--nri-socket", "nri_socket", default=defaults.DEFAULT_NRI_SOCKET, show_default=True, metavar="PATH",
         env="NRI_SOCKET", help="The runtime's NRI socket."),
    _opt("--nri-namespace", "nri_namespace", default="", env="NRI_NAMESPACE",
         help="The Kubernetes namespace the installer runs in: its pods may ask for management.nvidia.com/gpu."),
    _opt("--nri-management-cdi-device-namespaces", "nri_management_namespaces", multiple=True,
         env="NRI_MANAGEMENT_CDI_DEVICE_NAMESPACES",
         help="More namespaces whose pods may ask for management.nvidia.com/gpu devices."),
]


@click.group("toolkit", help="Install nvct on a node for a container engine (the GPU Operator's DaemonSet).")
def toolkit_group() -> None:
    pass


def _options(f):
    for option in reversed(_INSTALLER + _TOOLKIT + _ENGINE + _NRI):
        f = option(f)
    return f


@toolkit_group.command("install", help="Install the toolkit, configure the container engine, and undo both "
                                       "on SIGTERM (unless --no-daemon).")
@_options
def install_command(debug: bool, **kwargs) -> None:
    from nvct.toolkit import Options, run

    for name in _LISTS:
        kwargs[name] = [item.strip() for value in kwargs[name] for item in value.split(",")]
        if name != "create_device_nodes":  # there, '' means none
            kwargs[name] = [item for item in kwargs[name] if item]
    kwargs["config_sources"] = kwargs["config_sources"] or ["command", "file"]
    kwargs["runtime_config_override"] = _json_object(kwargs["runtime_config_override"])
    try:
        code = run(Options(**kwargs))
    except Exception:
        if debug:
            traceback.print_exc()
        raise
    raise SystemExit(code)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError as e:
        raise ConfigError(f"--runtime-config-override: invalid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError("--runtime-config-override: expected a JSON object")
    return value


@toolkit_group.command("prune-standins", help="Remove the stand-ins a removed nvct left at its runtime paths that no "
                       "running container needs any more (what doctor's toolkit.standins names). PATH: a stand-in, "
                       "or a directory of them; none: the default toolkit directory and the package's runtime paths.")
@click.argument("paths", nargs=-1, metavar="[PATH]...")
def prune_standins_command(paths: tuple[str, ...]) -> None:
    from nvct.doctor.model import default_toolkit_dir
    from nvct.doctor.standins import places
    from nvct.toolkit import standin

    found: list[str] = [] if paths else places((default_toolkit_dir(),))
    for path in map(os.path.abspath, paths):
        if os.path.isdir(path) and not os.path.islink(path):
            found += standin.standins(path)
        elif standin.is_standin(path):
            found.append(path)
        else:
            raise ConfigError(f"{path}: not a stand-in of nvct (nothing removed)")
    removed = standin.prune_paths(found)
    for path in found:
        click.echo(f"removed {path}" if path in removed else
                   f"kept {path}: a running container still needs it (it goes with the last of them)")
