"""``nvct cdi generate`` without click: the CDI refresh units run it on boots and driver changes.

click's import alone costs ~20 ms, half of the start budget. :func:`fast_main`
takes the plain command lines (the options below, ``--opt value`` or
``--opt=value``) and returns None for anything else (``--help``, a global
option, an unknown or malformed option), which click then handles and
reports as usual. Both paths end in :func:`run`.
"""

from __future__ import annotations

import os
import sys

#: option -> (parameter, choices or None); () marks a flag.
_OPTIONS = {
    "--output": ("output", None), "--format": ("fmt", ("yaml", "json")),
    "--mode": ("mode", ("auto", "nvml", "management")),
    "--discovery-mode": ("mode", ("auto", "nvml", "management")),
    "--device-name-strategy": ("strategies", ("index", "uuid", "type-index")),
    "--device-id": ("device_ids", None), "--device-ids": ("device_ids", None),
    "--driver-root": ("driver_root", None), "--dev-root": ("dev_root", None),
    "--vendor": ("vendor", None), "--cdi-vendor": ("vendor", None),
    "--class": ("cls", None), "--cdi-class": ("cls", None),
    "--hook-path": ("hook_path", None), "--nvidia-cdi-hook-path": ("hook_path", None),
    "--no-all-device": ("no_all_device", ()),
}
_REPEATED = ("strategies", "device_ids")
#: case-insensitive choices, as click.Choice(case_sensitive=False) there
_FOLDED = ("fmt", "mode")


def fast_main(argv: list[str]) -> int | None:
    """``argv`` after ``cdi generate``; None: not a plain command line, let click take it."""
    opts = _parse(argv)
    if opts is None:
        return None
    from nvct import config as config_mod
    from nvct.errors import NvctError

    try:
        message = run(config_mod.load(os.environ.get(config_mod.CONFIG_ENV) or None), **opts)
    except NvctError as e:
        sys.stderr.write(f"nvct: {e}\n")
        return 1
    if message:
        sys.stderr.write(message + "\n")
    return 0


def _parse(argv: list[str]) -> dict | None:
    opts: dict = {"output": os.environ.get("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", ""),
                  "fmt": os.environ.get("NVIDIA_CTK_CDI_OUTPUT_FORMAT") or None,
                  "mode": "auto", "strategies": [], "device_ids": [], "driver_root": None,
                  "dev_root": None, "vendor": "nvidia.com", "cls": "gpu", "no_all_device": False,
                  "hook_path": None}
    if opts["fmt"] is not None and opts["fmt"].lower() not in ("yaml", "json"):
        return None
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        known = _OPTIONS.get(name)
        if known is None:
            return None
        param, choices = known
        if choices == ():
            if eq:
                return None
            opts[param] = True
            continue
        if not eq:
            value = next(args, None)
            if value is None or value.startswith("-"):
                return None
        if choices and (value.lower() if param in _FOLDED else value) not in choices:
            return None
        if param in _REPEATED:
            opts[param].append(value)
        else:
            opts[param] = value
    return opts


def run(config, *, output, fmt, mode, strategies, device_ids, driver_root, dev_root, vendor, cls,
        no_all_device, hook_path) -> str | None:
    """Generate the spec; write it to stdout or ``output``. Returns the line for stderr, if any."""
    from nvct.cdi import encoding, generate, spec as spec_mod
    from nvct.driver import Driver
    from nvct.errors import NvctError
    from nvct.injection import hook_executable, ldconfig_setting

    fmt = output_format(fmt, output)
    if hook_path is not None and not hook_path.startswith("/"):
        raise NvctError(f"--hook-path: {hook_path!r} is not an absolute path")
    if dev_root is None:
        dev_root = driver_root if driver_root is not None else config.dev_root
    driver = Driver(driver_root or config.driver_root, dev_root or "/", config.proc_root,
                    config.get("nvidia-container-cli.ldcache") or None)
    raw = generate.generate(
        driver, hook_path=hook_path or hook_executable(config), vendor=vendor, cls=cls,
        device_ids=split_list(device_ids) or ("all",), strategies=tuple(strategies) or generate.DEFAULT_STRATEGIES,
        mode=mode.lower(), all_device=not no_all_device, ldconfig=ldconfig_setting(config))
    if not output:
        sys.stdout.write(encoding.dumps(raw, fmt))
        return None
    written = spec_mod.save(raw, output, fmt)
    return f"nvct: wrote {written} (cdiVersion {raw['cdiVersion']}, {len(raw['devices'])} devices)"


def split_list(values) -> tuple[str, ...]:
    """Repeated options that may also hold comma-separated lists (``--device-id 0,1``)."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def output_format(fmt: str | None, output: str, default: str = "yaml") -> str:
    from nvct.cdi.encoding import format_for
    from nvct.errors import NvctError

    implied = format_for(output) if output else None
    if fmt and implied and fmt.lower() != implied:
        raise NvctError(f"--format {fmt} does not match --output {output}")
    return (fmt or implied or default).lower()
