"""``nvidia-container-cli``: libnvidia-container's command line, on nvct's code.

What callers run: containerd's and nerdctl's ``--gpus`` add the prestart hook
``containerd oci-hook -- nvidia-container-cli --load-kmods configure
--device=N --compute --compat32 --graphics --utility --video --display
--pid={{pid}} {{rootfs}}``; Apptainer's ``--nvccli`` and enroot run
``nvidia-container-cli [--user] [--debug=F] configure --no-cgroups
--ldconfig=@/sbin/ldconfig --device=... --<cap>... ROOTFS`` themselves;
people run ``info`` and ``list``.

``configure`` is the legacy hook's realization (:func:`nvct.modifier.legacy.legacy`)
with the request taken from the flags instead of the container's env: one
code path. ``info`` and ``list`` print libnvidia-container's formats.

Driver, /dev and /proc roots: ``--root`` is the driver root, as in the
reference; otherwise nvct's config (``NVIDIA_CTK_CONFIG_FILE_PATH``, the
usual file) gives the three roots, as for every nvct program.
"""

from __future__ import annotations

import os
import sys

from nvct.base.errors import NvctError
from nvct.programs.options import OPTIONAL, YES, Option, UsageError, parse

PROG = "nvidia-container-cli"

GLOBAL = [
    Option("debug", "d", YES), Option("load-kmods", "k"), Option("no-pivot", "n"),
    Option("user", "u", OPTIONAL), Option("root", "r", YES), Option("ldcache", "l", YES),
    Option("no-create-imex-channels"), Option("help", "?"), Option("usage"), Option("version", "V"),
]
INFO = [Option("csv"), Option("help", "?")]
LIST = [
    Option("device", "d", YES, repeat=True), Option("libraries", "l"), Option("binaries", "b"),
    Option("ipcs", "i"), Option("firmwares", "f"), Option("compat32"), Option("mig-config", None, YES, repeat=True),
    Option("mig-monitor", None, YES, repeat=True), Option("help", "?"),
]
#: Capability flags of ``configure`` (``--compute`` ...) -> nvct's capability names.
CAPABILITY_FLAGS = ("compute", "utility", "video", "graphics", "display", "ngx", "compat32")
CONFIGURE = [
    Option("pid", "p", YES), Option("device", "d", YES, repeat=True), Option("require", "r", YES, repeat=True),
    Option("ldconfig", "l", YES), Option("compute", "c"), Option("utility", "u"), Option("video", "v"),
    Option("graphics", "g"), Option("display", "D"), Option("ngx", "n"), Option("compat32"),
    Option("no-cgroups"), Option("no-devbind"), Option("mig-config", None, YES, repeat=True),
    Option("mig-monitor", None, YES, repeat=True), Option("imex-channel", None, YES, repeat=True),
    Option("cuda-compat-mode", None, YES), Option("no-cntlibs"), Option("no-persistenced"),
    Option("no-fabricmanager"), Option("no-gsp-firmware"), Option("no-create-imex-channels"),
    Option("help", "?"),
]
#: ``--cuda-compat-mode`` values -> nvct's ``modes.legacy.cuda-compat-mode``.
_COMPAT_MODES = {"mount": "mount", "ldconfig": "ldconfig", "hook": "hook", "disabled": "disabled"}

USAGE = (f"Usage: {PROG} [-k?V] [-d FILE] [-l FILE] [-r PATH] [-u[UID[:GID]]] COMMAND [ARG...]\n"
         "Commands: info [--csv], list [-lbif] [-d ID] [--compat32] [--mig-config ID] [--mig-monitor ID],\n"
         "          configure [-p PID] [-d ID] [-r EXPR] [-l PATH] [-cuvgDn] [--compat32] [--no-cgroups]\n"
         "                    [--no-devbind] [--mig-config ID] [--mig-monitor ID] [--imex-channel ID]\n"
         "                    [--cuda-compat-mode MODE] [--no-cntlibs] ROOTFS\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from nvct.linux import privileges

    privileges.sanitize_environ()
    try:
        values, rest = parse(argv, GLOBAL, in_order=True)
        if "version" in values:
            from nvct.programs.version import container_cli_banner

            sys.stdout.write(container_cli_banner())
            return 0
        if "help" in values or "usage" in values:
            sys.stdout.write(USAGE)
            return 0
        if not rest:
            raise UsageError("missing command (info, list, configure)")
        command, args = rest[0], rest[1:]
        handler = {"info": _info, "list": _list, "configure": _configure}.get(command)
        if handler is None:
            raise UsageError(f"unknown command {command!r} (info, list, configure)")
        if values.get("debug"):
            os.environ["NVC_DEBUG_FILE"] = values["debug"]
        return handler(values, args)
    except UsageError as e:
        sys.stderr.write(f"{PROG}: {e}\nTry `{PROG} --help' for more information.\n")
        return 1
    except NvctError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    except Exception as e:  # noqa: BLE001 - the runtime shows stderr: one line, no traceback
        sys.stderr.write(f"{PROG}: internal error: {type(e).__name__}: {e}\n")
        return 1


# --- shared ---------------------------------------------------------------

def _config(values: dict, overrides: dict | None = None):
    """nvct's config with the global flags (``--root``, ``--ldcache``, ``--load-kmods``) and a
    command's own (``overrides``: rows of the key table -> values) applied."""
    from nvct.config import file as config_mod
    from nvct.config.keys import Settings as S

    flags: dict = {S.cli_load_kmods: bool(values.get("load-kmods"))}
    for name, row in (("root", S.cli_root), ("ldcache", S.cli_ldcache), ("debug", S.cli_debug)):
        if values.get(name):
            flags[row] = values[name]
    config = config_mod.load().overridden({**flags, **(overrides or {})})
    if values.get("debug"):
        from nvct.base import log

        log.setup("debug", values["debug"])
    return config


def _driver(config):
    from nvct.discover.driver import Driver

    driver = Driver.from_config(config)
    if config.cli_load_kmods:
        from nvct.node import kmods

        kmods.load(config.proc_root, config.dev_root)
    return driver


def _ids(values: dict, name: str) -> tuple[str, ...]:
    return tuple(i.strip() for v in values.get(name, ()) for i in v.split(",") if i.strip())


# --- info -----------------------------------------------------------------

#: NVML's brand (as nvct.discover.nvml names it) -> libnvidia-container's name; later brands by NVML's names.
BRANDS = {"unknown": "Unknown", "quadro": "Quadro", "tesla": "Tesla", "nvs": "NVS", "grid": "GRID",
          "geforce": "GeForce", "titan": "TITAN", "nvidiavapps": "NVIDIA Virtual Applications",
          "nvidiavpc": "NVIDIA Virtual PC", "nvidiavcs": "NVIDIA Virtual Compute Server",
          "nvidiavws": "NVIDIA RTX Virtual Workstation", "nvidiacloudgaming": "NVIDIA Cloud Gaming",
          "quadrortx": "Quadro RTX", "nvidiartx": "NVIDIA RTX", "nvidia": "NVIDIA", "geforcertx": "GeForce RTX",
          "titanrtx": "TITAN RTX"}


def info_rows(driver) -> tuple[dict, list[dict]]:
    """The driver's and each GPU's fields, as ``info`` prints them."""
    gpus = []
    with driver.nvml() as nvml:
        head = {"NVRM version": driver.version, "CUDA version": nvml.cuda_driver_version()}
        for gpu in driver.gpus:
            handle = nvml.handle_by_uuid(gpu.uuid)
            gpus.append({"Device Index": gpu.index, "Device Minor": gpu.minor, "Model": gpu.model,
                         "Brand": BRANDS.get(nvml.brand(handle), "Unknown"), "GPU UUID": gpu.uuid,
                         "Bus Location": _bus_location(gpu.bus_id),
                         "Architecture": nvml.compute_capability(handle)})
    return head, gpus


def _bus_location(bus_id: str) -> str:
    """``00000000:1b:00.0``: NVML's 8-digit domain, lower case."""
    domain, _, rest = bus_id.partition(":")
    return f"{domain.lower().zfill(8)}:{rest.lower()}" if rest.count(":") == 1 else bus_id.lower()


def _info(values: dict, argv: list[str]) -> int:
    opts, operands = parse(argv, INFO)
    if operands:
        raise UsageError(f"info: unexpected argument {operands[0]!r}")
    driver = _driver(_config(values))
    platform = _platform(driver)
    if platform:
        raise NvctError(f"info: {platform} has no NVIDIA kernel module or NVML to report (list, `nvct explain` "
                        "and `nvct doctor` show what its containers get)")
    head, gpus = info_rows(driver)
    out = []
    if "csv" in opts:
        out.append("NVRM version,CUDA version")
        out.append(f"{head['NVRM version']},{head['CUDA version']}")
        out.append("")
        out.append("Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture")
        out.extend(",".join(str(g[k]) for k in g) for g in gpus)
    else:
        out.extend(f"{k + ':':<15} {v}" for k, v in head.items())
        for gpu in gpus:
            out.append("")
            out.extend(f"{k + ':':<15} {v}" for k, v in gpu.items())
    sys.stdout.write("\n".join(out) + "\n")
    return 0


# --- list -----------------------------------------------------------------

def list_paths(driver, *, devices, mig_config, mig_monitor, libraries, binaries, ipcs, firmwares,
               compat32) -> list[str]:
    """Host paths in libnvidia-container's order: control nodes, GPUs, MIG files, binaries,
    libraries (32-bit last), IPC, firmware. ``all`` selects every GPU and MIG device, as there."""
    from nvct.edits.devices import Selection, select

    out: list[str] = []
    proc = driver.proc_root
    caps = os.path.join(proc, "driver/nvidia/capabilities")
    selection = select(devices, driver, what="--device") if devices is not None else Selection()
    if devices is not None:
        out += [driver.dev_host_path(n.path) for n in driver.control_nodes()]
        out += [driver.dev_host_path(driver.gpu_node(g).path) for g in selection.all_parents()]
        if mig_config != ("all",) and mig_monitor != ("all",):
            for gpu, mig in selection.migs:
                gi = f"{caps}/gpu{gpu.minor}/mig/gi{mig.gi}"
                out += [f"{gi}/access", f"{gi}/ci{mig.ci}/access"]
    for ids, name in ((mig_config, "config"), (mig_monitor, "monitor")):
        if not ids:
            continue
        if ids != ("all",):
            raise UsageError(f"--mig-{name}: only 'all' devices are supported")
        if selection.migs and devices != ("all",):
            raise UsageError(f"--mig-{name}: cannot be used with specific MIG devices selected")
        out.append(f"{caps}/mig/{name}")
        # the visible GPUs that are MIG capable: the driver gives those a capabilities directory
        out += [f"{caps}/gpu{g.minor}/mig" for g in selection.all_parents()
                if os.path.isdir(f"{caps}/gpu{g.minor}/mig")]
    if binaries:
        from nvct.discover.driver import BINARIES

        out += [driver.host_path(p) for p in driver.binaries(sorted(BINARIES))]
    if libraries:
        libs = driver.all_libraries
        out += [driver.host_path(lib.path) for lib in libs if not lib.compat32]
        if compat32:
            out += [driver.host_path(lib.path) for lib in libs if lib.compat32]
    if ipcs:
        out += [driver.host_path(p) for p in driver.ipc(["utility", "compute"])]
    if firmwares:
        out += [driver.host_path(p) for p in driver.firmware()]
    return list(dict.fromkeys(out))


def _list(values: dict, argv: list[str]) -> int:
    opts, operands = parse(argv, LIST)
    if operands:
        raise UsageError(f"list: unexpected argument {operands[0]!r}")
    everything = not argv
    devices = ("all",) if everything else (_ids(opts, "device") or None)
    config = _config(values)
    driver = _driver(config)
    if _platform(driver):
        paths = _platform_paths(driver, config, devices=devices is not None,
                                files=everything or "libraries" in opts or "binaries" in opts)
        sys.stdout.write("".join(p + "\n" for p in paths))
        return 0
    paths = list_paths(
        driver,
        devices=devices,
        mig_config=("all",) if everything else _ids(opts, "mig-config"),
        mig_monitor=("all",) if everything else _ids(opts, "mig-monitor"),
        libraries=everything or "libraries" in opts, binaries=everything or "binaries" in opts,
        ipcs=everything or "ipcs" in opts, firmwares=everything or "firmwares" in opts,
        compat32=everything or "compat32" in opts)
    sys.stdout.write("".join(p + "\n" for p in paths))
    return 0


def _platform(driver) -> str | None:
    """"a WSL2 node" or "a Tegra board" (no NVIDIA kernel module: nvct.edits.wsl, nvct.edits.csvmode), else None."""
    from nvct.edits import csvmode, wsl

    if wsl.is_wsl(driver):
        return "a WSL2 node"
    return "a Tegra board" if csvmode.is_tegra(driver) else None


def _platform_paths(driver, config, *, devices: bool, files: bool) -> list[str]:
    """Host paths a GPU container gets on a WSL2 node or a Tegra board: device nodes, then files."""
    from nvct.edits import csvmode, wsl

    if wsl.is_wsl(driver):
        nodes = [driver.dev_host_path(wsl.DXG)]
        paths = [driver.host_path(real) for _, real in wsl.files(driver)]
    else:
        edits = csvmode.container_edits(driver, csvmode.csv_files(csvmode.mount_spec_path(config)), hook_path="")
        nodes = [n.host_path for n in edits.device_nodes]
        paths = [m.host_path for m in edits.mounts]
    return (nodes if devices else []) + (paths if files else [])


# --- configure --------------------------------------------------------------

def configure_request(opts: dict):
    """The :class:`nvct.request.container.Request` that configure's flags ask for."""
    from nvct.request import requirements
    from nvct.request.container import Request

    devices = _ids(opts, "device")
    if "all" in devices:
        devices = ("all",)
    env = {f"NVIDIA_REQUIRE_CLI_{i:03d}": expr for i, expr in enumerate(opts.get("require", ()))}
    for channel in _ids(opts, "imex-channel"):
        if not (channel.isascii() and channel.isdigit()):
            raise UsageError(f"configure: invalid --imex-channel {channel!r} (expected a number)")
    return Request(
        devices=devices,
        capabilities=tuple(sorted(c for c in CAPABILITY_FLAGS if c in opts)),
        requirements=tuple(requirements.collect(env)),
        mig_config=_ids(opts, "mig-config"),
        mig_monitor=_ids(opts, "mig-monitor"),
        imex_channels=_ids(opts, "imex-channel"),
        privileged=True,
        source="nvidia-container-cli",
        env=env,
    )


def _configure(values: dict, argv: list[str]) -> int:
    opts, operands = parse(argv, CONFIGURE)
    if len(operands) != 1:
        raise UsageError("configure: expected exactly one ROOTFS argument")
    rootfs = operands[0]
    if not rootfs.startswith("/") or os.path.normpath(rootfs) == "/":
        raise UsageError(f"configure: invalid rootfs directory {rootfs!r}")
    pid = _pid(opts.get("pid"))
    from nvct.config.keys import Settings as S

    overrides: dict = {S.cli_no_cgroups: "no-cgroups" in opts}
    if opts.get("ldconfig"):
        overrides[S.cli_ldconfig] = opts["ldconfig"]
    mode = opts.get("cuda-compat-mode")
    if "no-cntlibs" in opts:
        mode = "disabled"
    if mode is not None:
        if mode not in _COMPAT_MODES:
            raise UsageError(f"configure: invalid --cuda-compat-mode {mode!r} "
                             f"(expected one of {', '.join(_COMPAT_MODES)})")
        overrides[S.legacy_cuda_compat_mode] = _COMPAT_MODES[mode]
    config = _config(values, overrides)
    request = configure_request(opts)
    from nvct.modifier import legacy as realize

    realize.legacy(request, config, {}, None, pid, rootfs=os.path.normpath(rootfs),
                   devbind="no-devbind" not in opts)
    return 0


def _pid(raw) -> int:
    """``--pid``, else the parent process (the reference's standalone mode)."""
    if raw is None:
        return os.getppid()
    if not (str(raw).isascii() and str(raw).isdigit()) or int(raw) <= 0:
        raise UsageError(f"configure: invalid --pid {raw!r}")
    return int(raw)
