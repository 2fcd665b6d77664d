"""``nvct cdi generate``: its one option table, and a path without click for the refresh units.

:data:`OPTIONS` is the only definition of the command's options: the click
command (:mod:`nvct.cli.cdi`) is built from it, and :func:`fast_main` parses
plain command lines with it (click's import alone costs ~20 ms, half of the
start budget). Each option has the reference's names and variables, and
:func:`resolve` applies the reference's precedence: the command line, then
the variable, then the config file (``nvidia-container-cli.root`` for the
driver root), then the default. List options take repeats and commas.
"""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError

VALUE, LIST, FLAG = "value", "list", "flag"


class Option:
    """One option: its names, parameter, kind, variables (first wins), choices, help."""

    __slots__ = ("names", "param", "kind", "env", "choices", "metavar", "help", "default")

    def __init__(self, names: tuple[str, ...], param: str, kind: str, env: tuple[str, ...],
                 help: str, *, choices: tuple[str, ...] | None = None, metavar: str | None = None,
                 default=None):
        self.names, self.param, self.kind, self.env = names, param, kind, env
        self.help, self.choices, self.metavar = help, choices, metavar
        self.default = default if default is not None else {LIST: (), FLAG: False}.get(kind)


_MODES = ("auto", "nvml", "management", "gds", "mofed", "gdrcopy", "nvswitch", "imex", "csv", "wsl", "sandbox")
_G = "NVIDIA_CTK_CDI_GENERATE_"

OPTIONS = (
    Option(("--output",), "output", VALUE, ("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH",),
           "Write here (atomically) instead of to stdout; a name without .yaml/.json gets one.", metavar="FILE",
           default=""),
    Option(("--format",), "fmt", VALUE, (_G + "OUTPUT_FORMAT",),
           "Output format (default: from the --output extension, else yaml).", choices=("yaml", "json")),
    Option(("--mode", "--discovery-mode"), "mode", VALUE, (_G + "MODE",),
           "auto/nvml: the GPUs; management: an 'all' device with every NVIDIA device node, and each GPU's "
           "and MIG device's nodes under its names; gds, mofed, "
           "gdrcopy, nvswitch: one 'all' device with that subsystem's nodes; imex: a device per IMEX channel "
           "(default: auto); sandbox: the GPUs with no hook, for user namespaces and sandboxes.",
           choices=_MODES, default="auto"),
    Option(("--device-name-strategy",), "strategies", LIST, (_G + "DEVICE_NAME_STRATEGIES",),
           "index, uuid or type-index; repeat for several names each (default: index and uuid).",
           metavar="STRATEGY"),
    Option(("--device-id", "--device-ids", "--device", "--devices"), "device_ids", LIST, (_G + "DEVICE_IDS",),
           "Only these GPUs/MIG devices (index, GPU:MIG, UUID, PCI bus id, all, none), or IMEX channels "
           "(default: all).", metavar="ID", default=("all",)),
    Option(("--driver-root",), "driver_root", VALUE, ("NVIDIA_CTK_DRIVER_ROOT",),
           "Where the driver's files are (default: the config's nvidia-container-cli.root).", metavar="DIR"),
    Option(("--dev-root",), "dev_root", VALUE, ("NVIDIA_CTK_DEV_ROOT",),
           "Where /dev is (default: --driver-root when given, else the config's).", metavar="DIR"),
    Option(("--vendor", "--cdi-vendor"), "vendor", VALUE, (_G + "VENDOR",), "CDI vendor (default: nvidia.com).",
           default="nvidia.com"),
    Option(("--class", "--cdi-class"), "cls", VALUE, (_G + "CLASS",), "CDI class (default: gpu).", default="gpu"),
    Option(("--nvidia-cdi-hook-path", "--nvidia-ctk-path", "--hook-path"), "hook_path", VALUE,
           ("NVIDIA_CTK_CDI_HOOK_PATH",),
           "The program the createContainer hook runs; a bare name is looked up on PATH (default: this nvct).",
           metavar="PATH"),
    Option(("--ldconfig-path",), "ldconfig_path", VALUE, (_G + "LDCONFIG_PATH",),
           "The host ldconfig the update-ldcache step may run (default: the config's).", metavar="PATH"),
    Option(("--disable-hook", "--disable-hooks"), "disabled_hooks", LIST, (_G + "DISABLED_HOOKS",),
           "Leave this hook out; 'all' leaves every hook out.", metavar="HOOK"),
    Option(("--enable-hook", "--enable-hooks"), "enabled_hooks", LIST, (_G + "ENABLED_HOOKS",),
           "Keep this hook even if disabled (chmod is off by default).", metavar="HOOK"),
    Option(("--feature-flag", "--feature-flags"), "feature_flags", LIST, (_G + "FEATURE_FLAGS",),
           "disable-ipc-discoverer, enable-explicit-driver-libraries, disable-nvsandboxutils, "
           "no-additional-gids-for-device-nodes, enable-coherent-annotations.", metavar="FLAG"),
    Option(("--library-search-path",), "library_search_paths", LIST, (_G + "LIBRARY_SEARCH_PATHS",),
           "csv mode only (as the reference); nvct finds libraries through the driver root's ld cache.",
           metavar="DIR"),
    Option(("--config-search-path",), "config_search_paths", LIST, (_G + "CONFIG_SEARCH_PATHS",),
           "Not used by nvct: it finds the driver's config files in their standard directories.", metavar="DIR"),
    Option(("--csv.file",), "csv_files", LIST, (_G + "CSV_FILES",), "csv mode: the CSV files (default: "
           "devices.csv, drivers.csv and l4t.csv in /etc/nvidia-container-runtime/host-files-for-container.d).",
           metavar="FILE"),
    Option(("--csv.ignore-pattern",), "csv_ignore_patterns", LIST, (_G + "CSV_IGNORE_PATTERNS",),
           "Not used by nvct's csv mode.", metavar="PATTERN"),
    Option(("--csv.compat-container-root",), "csv_compat_root", VALUE, (_G + "CSV_CONTAINER_COMPAT_ROOT",),
           "Not used by nvct's csv mode.", metavar="DIR"),
    Option(("--no-all-device",), "no_all_device", FLAG, (_G + "NO_ALL_DEVICE",), "Do not add the 'all' device."),
)
#: Variables nvct read by mistake once: still read, with a warning.
DEPRECATED_ENV = {"NVIDIA_CTK_CDI_OUTPUT_FORMAT": _G + "OUTPUT_FORMAT"}
_BY_NAME = {name: opt for opt in OPTIONS for name in opt.names}
#: case-insensitive choices, as the reference lowers them
_FOLDED = ("fmt", "mode")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def fast_main(argv: list[str]) -> int | None:
    """``argv`` after ``cdi generate``; None: not a plain command line, let click take it."""
    given = _parse(argv)
    if given is None:
        return None
    from nvct.config import file as config_mod

    try:
        message = run(config_mod.load(os.environ.get(config_mod.CONFIG_ENV) or None), given)
    except NvctError as e:
        sys.stderr.write(f"nvct: {e}\n")
        return 1
    if message:
        sys.stderr.write(message + "\n")
    return 0


def _parse(argv: list[str]) -> dict | None:
    """The options given on the command line (lists as given), or None for click."""
    given: dict = {}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        opt = _BY_NAME.get(name)
        if opt is None:
            return None
        if opt.kind == FLAG:
            if eq:
                return None
            given[opt.param] = True
            continue
        if not eq:
            following = next(args, None)
            if following is None or following.startswith("-"):
                return None
            value = following
        if opt.choices and value.lower() not in opt.choices:
            return None
        if opt.kind == LIST:
            given.setdefault(opt.param, []).append(value)
        else:
            given[opt.param] = value
    return given


def resolve(given: dict, environ, config) -> dict:
    """Every parameter: given > variable > config > default.

    The device root defaults to a driver root given by flag or variable (the
    reference's rule); else it stays None, for the config's.
    """
    from nvct.base.log import logger

    out = {opt.param: opt.default for opt in OPTIONS}
    root_given = False
    for opt in OPTIONS:
        if opt.param in given:
            raw, source = given[opt.param], opt.names[0]
        else:
            raw, source = None, None
            for var in opt.env + tuple(old for old, new in DEPRECATED_ENV.items() if new in opt.env):
                if environ.get(var):
                    raw, source = environ[var], var
                    if var in DEPRECATED_ENV:
                        logger.warning("%s is deprecated (NVIDIA's toolkit never read it): set %s", var,
                                       DEPRECATED_ENV[var])
                    break
            if raw is None:
                continue
        root_given = root_given or opt.param == "driver_root"
        if opt.kind == FLAG:
            if raw is True or raw in _TRUE:
                out[opt.param] = True
            elif raw is False or raw in _FALSE:
                out[opt.param] = False
            else:
                raise NvctError(f"{source}: {raw!r} is not a boolean (true or false)")
            continue
        if opt.kind == LIST:
            out[opt.param] = split_list([raw] if isinstance(raw, str) else raw)
            continue
        value = raw.lower() if opt.param in _FOLDED else raw
        if opt.choices and value not in opt.choices:
            raise NvctError(f"{source}: invalid value {raw!r} (one of {', '.join(opt.choices)})")
        out[opt.param] = value
    if out["dev_root"] is None and root_given:
        out["dev_root"] = out["driver_root"]
    if out["driver_root"] is None:
        out["driver_root"] = config.cli_root or None
    return out


def run(config, given: dict) -> str | None:
    """Generate the spec; write it to stdout or ``output``. Returns the line for stderr, if any."""
    from nvct.base import log
    from nvct.cdi import encoding, features, generate, spec as spec_mod
    from nvct.discover.driver import Driver
    from nvct.edits import csvmode
    from nvct.edits.build import hook_executable, ldconfig_setting

    if not log.logger.is_enabled_for("debug"):
        log.setup(level="warning", stderr=True)
    o = resolve(given, os.environ, config)
    _warn_unused(o)
    fmt = output_format(o["fmt"], o["output"])
    hook_path = _hook_path(o["hook_path"]) if o["hook_path"] else hook_executable(config)
    ldconfig = o["ldconfig_path"] or ldconfig_setting(config)
    if o["ldconfig_path"] and not o["ldconfig_path"].lstrip("@").startswith("/"):
        raise NvctError(f"--ldconfig-path: {o['ldconfig_path']!r} is not an absolute host path")
    driver = Driver(o["driver_root"] or config.driver_root, o["dev_root"] or config.dev_root, config.proc_root,
                    config.cli_ldcache or None)
    generation = features.Generation(o["feature_flags"], o["disabled_hooks"], o["enabled_hooks"])
    device_ids = o["device_ids"] or ("all",)
    if o["csv_files"] and not (o["mode"] == "csv" or (o["mode"] == "auto" and csvmode.is_tegra(driver))):
        log.logger.warning("--csv.file ignored: it applies to csv mode only (a Tegra board's)")
    csv_default = csvmode.csv_files(csvmode.mount_spec_path(config)) if o["mode"] in ("csv", "auto") else []

    def spec(cls: str, ids) -> dict:
        return generate.generate(
            driver, hook_path=hook_path, vendor=o["vendor"], cls=cls, device_ids=ids,
            strategies=o["strategies"] or generate.DEFAULT_STRATEGIES, mode=o["mode"],
            all_device=not o["no_all_device"], ldconfig=ldconfig, generation=generation,
            requirements=config.disable_require is not True, csv_files=o["csv_files"] or csv_default)

    specs = [("", spec(o["cls"], device_ids))]
    if (features.COHERENT_ANNOTATIONS in generation.features and o["mode"] in ("auto", "nvml", "sandbox")
            and "none" not in device_ids):
        specs += [(infix, spec(o["cls"] + infix, uuids))
                  for infix, uuids in features.coherence_groups(driver, device_ids)]
    lines = []
    for infix, raw in specs:
        if not o["output"]:
            sys.stdout.write(encoding.dumps(raw, fmt))
            continue
        written = spec_mod.save(raw, _with_infix(o["output"], infix), fmt)
        lines.append(f"nvct: wrote {written} (cdiVersion {raw['cdiVersion']}, {len(raw['devices'])} devices)")
    return "\n".join(lines) or None


def _with_infix(path: str, infix: str) -> str:
    """``nvidia.yaml`` -> ``nvidia.coherent.yaml``, as the reference names the extra specs."""
    stem, ext = os.path.splitext(path)
    return stem + infix + ext if os.path.basename(stem) else path + infix


def _warn_unused(o: dict) -> None:
    from nvct.base.log import logger

    if o["library_search_paths"]:
        logger.warning("--library-search-path ignored: it applies to csv mode only (as in NVIDIA's toolkit); "
                       "nvct finds the driver's libraries through the driver root's ld cache")
    if o["config_search_paths"]:
        logger.warning("--config-search-path ignored: nvct finds the driver's config files (ICD and profile "
                       "JSONs) in their standard directories under the driver root")
    for param, name in (("csv_ignore_patterns", "--csv.ignore-pattern"),
                        ("csv_compat_root", "--csv.compat-container-root")):
        if o[param]:
            logger.warning("%s ignored: nvct's csv (Tegra) mode does not use it", name)


def _hook_path(value: str) -> str:
    """An absolute path, or a bare name found on PATH (``nvidia-ctk``, ``nvidia-cdi-hook``)."""
    from nvct.oci.runtime import which

    if value.startswith("/"):
        return value
    if "/" not in value:
        found = which(value)
        if found:
            return os.path.abspath(found)
        raise NvctError(f"--nvidia-cdi-hook-path: {value!r} not found on PATH")
    raise NvctError(f"--nvidia-cdi-hook-path: {value!r} is not an absolute path")


def split_list(values) -> tuple[str, ...]:
    """Repeated options that may also hold comma-separated lists (``--device-id 0,1``)."""
    return tuple(v.strip() for value in values for v in value.split(",") if v.strip())


def output_format(fmt: str | None, output: str, default: str = "yaml") -> str:
    """The format asked, else the one ``output``'s extension implies.

    JSON in a ``.yaml`` file is written with a warning, as the reference writes
    it (JSON is YAML: every CDI reader parses it); YAML in a ``.json`` file,
    which no JSON parser reads, is refused.
    """
    from nvct.cdi.encoding import format_for

    implied = format_for(output) if output else None
    if fmt and implied and fmt.lower() != implied:
        if fmt.lower() != "json":
            raise NvctError(f"--format {fmt} does not match --output {output}")
        from nvct.base.log import logger

        logger.warning("writing JSON to %s, as --format asks (YAML readers parse it)", output)
    return (fmt or implied or default).lower()
