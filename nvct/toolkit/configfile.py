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

from nvct.config.keys import Settings as S
from nvct.config.render import render as render_toml
from nvct.toolkit.layout import Layout
from nvct.toolkit.options import Options

DEFAULT_LDCONFIG = str(S.cli_ldconfig.default)


def settings(opts: Options, layout: Layout, runtimes: list) -> dict[str, Any]:
    """Dotted key -> value: everything the installed configs set (``mode`` aside)."""
    out: dict[str, Any] = {
        S.accept_envvar_unprivileged.name: opts.accept_envvar_unprivileged,
        S.accept_volume_mounts.name: opts.accept_volume_mounts,
        S.cli_root.name: opts.driver_root,
        S.cli_ldconfig.name: ldconfig(opts.driver_root, opts.driver_root_ctr_path or opts.driver_root),
        S.hook_path.name: layout.hook,
        S.hook_skip_mode_detection.name: opts.hook_skip_mode_detection,
        S.runtimes.name: list(runtimes),
        S.nvct_path.name: layout.nvct,
        S.cli_path.name: layout.tool("nvidia-container-cli"),
        S.ctk_path.name: layout.tool("nvidia-ctk"),
    }
    optional = {
        S.mode.name: opts.runtime_mode,
        S.runtime_debug.name: opts.runtime_debug,
        S.runtime_log_level.name: opts.runtime_log_level,
        S.cdi_default_kind.name: opts.cdi_default_kind,
        S.cdi_annotation_prefixes.name: list(opts.cdi_annotation_prefixes) or None,
        S.cli_debug.name: opts.cli_debug,
        S.nvct_dev_root.name: opts.dev_root,
        S.nvct_proc_root.name: opts.proc_root,
    }
    out.update({k: v for k, v in optional.items() if v})
    for feature in opts.opt_in_features:
        out[f"features.{feature}"] = True
    return out


def render(values: Mapping[str, Any], mode: str | None = None) -> str:
    """The config file text: the defaults in the reference's layout, ``values`` set, ``mode`` forced."""
    from nvct.config.file import DEFAULTS, Config, parse_toml

    values = dict(values)
    if mode:
        values[S.mode.name] = mode
    data = copy.deepcopy(DEFAULTS)
    for key, value in values.items():
        node: Any = data
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
