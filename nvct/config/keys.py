"""The config.toml keys anyone has given a meaning: a typo (``mod = "legacy"``) is warned about, never refused.

The list is the union of every release of the reference's config struct
(its ``toml`` tags, including keys it has since dropped, and the keys its
shipped config.toml templates carried) and nvct's own ``[nvct]`` table. A key
outside it is most likely a typo; it is still accepted, because a newer
reference release may add keys that must keep working here.
"""

from __future__ import annotations

#: A table's keys; a nested dict is a sub-table.
_KNOWN: dict = {
    "accept-nvidia-visible-devices-as-volume-mounts": None,
    "accept-nvidia-visible-devices-envvar-when-unprivileged": None,
    "alpha-merge-visible-devices-envvars": None,  # an old template's
    "disable-require": None,
    "look-for-nvidia-visible-devices-as-volume-mounts-under": None,  # an old template's
    "supported-driver-capabilities": None,
    "swarm-resource": None,
    "nvidia-container-cli": dict.fromkeys((
        "root", "path", "environment", "debug", "ldcache", "load-kmods", "no-pivot", "no-cgroups", "user",
        "ldconfig")),
    "nvidia-container-runtime": {
        **dict.fromkeys(("debug", "log-level", "runtimes", "mode", "experimental", "discover-mode",
                         "mknod-only")),
        "modes": {
            "csv": dict.fromkeys(("mount-spec-path", "compat-container-root")),
            "cdi": dict.fromkeys(("spec-dirs", "default-kind", "annotation-prefixes")),
            "jit-cdi": dict.fromkeys(("nvcdi-feature-flags", "nvcdi-disable-hooks", "load-kernel-modules")),
            "legacy": dict.fromkeys(("cuda-compat-mode",)),
        },
    },
    "nvidia-container-runtime-hook": dict.fromkeys(("path", "skip-mode-detection")),
    "nvidia-ctk": dict.fromkeys(("path",)),
    "features": dict.fromkeys((
        "allow-cuda-compat-libs-from-container", "allow-ldconfig-from-container", "allow-unknown-oci-spec-fields",
        "disable-cuda-compat-lib-hook", "disable-imex-channel-creation", "ignore-imex-channel-requests",
        "no-additional-gids-for-device-nodes", "gds", "mofed", "nvswitch", "gdrcopy", "include-persistenced-socket",
        "include-gsp-firmware", "require-nvidia-kernel-module")),
    "nvct": dict.fromkeys(("dev-root", "proc-root", "path", "sandbox")),
}


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
    for key, value in table.items():
        if key not in known:
            out.append(prefix + key)
        elif isinstance(value, dict) and isinstance(known[key], dict):
            _walk(value, known[key], f"{prefix}{key}.", out)
