"""The installed ``config.toml``: nvct's defaults with the node's roots and the toolkit's paths.

What the reference installer sets: the driver root, the hook and nvct
paths inside the toolkit directory, the low-level runtimes found in the
engine's config, ``ldconfig`` from the driver root when it has one, and the
optional settings given on the command line. nvct adds its own roots
(``[nvct] dev-root``, ``proc-root``) when given. The ``.cdi`` and ``.legacy``
runtimes get the same file with ``mode`` forced (``config.<mode>.toml``).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Mapping

from nvct.toolkit.layout import Layout
from nvct.toolkit.options import Options

DEFAULT_LDCONFIG = "@/sbin/ldconfig"


def settings(opts: Options, layout: Layout, runtimes: list) -> dict[str, Any]:
    """Dotted key -> value: everything the installed configs set (``mode`` aside)."""
    out: dict[str, Any] = {
        "accept-nvidia-visible-devices-envvar-when-unprivileged": opts.accept_envvar_unprivileged,
        "accept-nvidia-visible-devices-as-volume-mounts": opts.accept_volume_mounts,
        "nvidia-container-cli.root": opts.driver_root,
        "nvidia-container-cli.ldconfig": ldconfig(opts.driver_root, opts.driver_root_ctr_path or opts.driver_root),
        "nvidia-container-runtime-hook.path": layout.hook,
        "nvidia-container-runtime-hook.skip-mode-detection": opts.hook_skip_mode_detection,
        "nvidia-container-runtime.runtimes": list(runtimes),
        "nvct.path": layout.nvct,
        "nvidia-container-cli.path": layout.tool("nvidia-container-cli"),
        "nvidia-ctk.path": layout.tool("nvidia-ctk"),
    }
    optional = {
        "nvidia-container-runtime.mode": opts.runtime_mode,
        "nvidia-container-runtime.debug": opts.runtime_debug,
        "nvidia-container-runtime.log-level": opts.runtime_log_level,
        "nvidia-container-runtime.modes.cdi.default-kind": opts.cdi_default_kind,
        "nvidia-container-runtime.modes.cdi.annotation-prefixes": list(opts.cdi_annotation_prefixes) or None,
        "nvidia-container-cli.debug": opts.cli_debug,
        "nvct.dev-root": opts.dev_root,
        "nvct.proc-root": opts.proc_root,
    }
    out.update({k: v for k, v in optional.items() if v})
    for feature in opts.opt_in_features:
        out[f"features.{feature}"] = True
    return out


def render(values: Mapping[str, Any], mode: str | None = None) -> str:
    """The config file text: the defaults in the reference's layout, ``values`` set, ``mode`` forced."""
    from nvct.config.render import render as render_toml
    from nvct.config.file import DEFAULTS, Config, parse_toml

    values = dict(values)
    if mode:
        values["nvidia-container-runtime.mode"] = mode
    data = copy.deepcopy(DEFAULTS)
    for key, value in values.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    text = render_toml(data, explicit=set(values))
    Config(parse_toml(text.encode("utf-8"), "the installed config"))  # never install a config nvct rejects
    return text


def ldconfig(driver_root: str, driver_root_seen: str) -> str:
    """``@<driver-root>/sbin/ldconfig[.real]`` when the driver root has one, else the host's.

    ``driver_root_seen`` is where the installer itself sees the driver root
    (``--driver-root-ctr-path``); the value written is the host's path.
    """
    for name in ("sbin/ldconfig.real", "sbin/ldconfig"):
        if os.path.isfile(os.path.join(driver_root_seen, name)):
            return "@" + os.path.join(driver_root, name)
    return DEFAULT_LDCONFIG
