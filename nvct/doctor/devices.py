"""Device nodes: majors from /proc/devices, the nodes under the dev root, their
modes, their /dev/char links, and (with --deep) persistence mode."""

from __future__ import annotations

import os
import stat

from nvct.base.errors import NvctError
from nvct.discover.driver import NVIDIA_MAJOR
from nvct.doctor.model import Context, fail, info, ok, warn

_CHAR_LINKS_FIX = "nvct system create-dev-char-symlinks --create-all"


def check_majors(ctx: Context):
    if ctx.version is None:
        yield ctx.skipped("devices.majors", "no kernel module (see driver.module)")
        return
    try:
        majors = ctx.driver.majors
    except NvctError as e:
        yield fail("devices.majors", str(e), "reload the module: modprobe nvidia")
        return
    where = f"{ctx.driver.proc_root}/devices"
    main = majors.get("nvidia", majors.get("nvidia-frontend"))
    if main is None:
        yield fail("devices.majors", f"{where} lists no 'nvidia' character device", "modprobe nvidia")
        return
    if main != NVIDIA_MAJOR:
        yield fail("devices.majors", f"{where}: nvidia has major {main}, not {NVIDIA_MAJOR}",
                   "reinstall the NVIDIA driver: its module must register major 195")
        return
    if "nvidia-uvm" not in majors:
        yield warn("devices.majors", f"{where} lists no nvidia-uvm: CUDA cannot start in containers",
                   "modprobe nvidia-uvm")
        return
    if any(g.migs for g in ctx.gpus or ()) and "nvidia-caps" not in majors:
        yield fail("devices.majors", f"{where} lists no nvidia-caps, but MIG devices exist",
                   "reload the module: modprobe -r nvidia_uvm nvidia && modprobe nvidia nvidia-uvm")
        return
    shown = ", ".join(f"{name} {majors[name]}" for name in sorted(majors) if name.startswith("nvidia"))
    yield ok("devices.majors", f"{where}: {shown}")


def expected_nodes(ctx: Context) -> list:
    """Every node a container may be given: control, uvm, GPUs, MIG access caps."""
    driver = ctx.driver
    nodes = list(driver.control_nodes())
    nodes += [driver.gpu_node(g) for g in ctx.gpus or ()]
    if "nvidia-caps" in driver.majors:
        for gpu in ctx.gpus or ():
            for mig in gpu.migs:
                nodes += [driver.cap_node(mig.gi_cap_minor), driver.cap_node(mig.ci_cap_minor)]
    return nodes


def check_nodes(ctx: Context):
    nodes = _nodes_or_skip(ctx)
    if nodes is not None and (why := ctx.missing_root("dev")):
        yield ctx.skipped("devices.nodes", why)
        return
    if nodes is None:
        yield ctx.skipped("devices.nodes", "no kernel module or no device majors (see driver.module)")
        return
    missing, wrong = [], []
    for node in nodes:
        try:
            st = os.lstat(node.host_path)
        except FileNotFoundError:
            missing.append(node)
            continue
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (node.major, node.minor):
            wrong.append((node, _describe(st)))
    root = ctx.driver.dev_root
    # Containers do not need these: runc and crun (and the hook) make each node from the numbers nvct
    # reads in procfs. What breaks is this host's own use of them (NVML, nvidia-smi).
    if missing:
        yield warn("devices.nodes",
                   f"{len(missing)} of {len(nodes)} device nodes missing under {root}: "
                   f"{_some(n.path for n in missing)} (dev root: {ctx.config.dev_root_source}). Containers "
                   f"still get them (runc and crun make each node from its major and minor), but on this host "
                   f"NVML and nvidia-smi do not see {_what(missing)}",
                   _in_host_dev_fix(ctx, missing) or _mknod_commands(missing))
    for node, seen in wrong:
        yield warn("devices.nodes", f"{node.host_path} is {seen}, expected c {node.major}:{node.minor}. "
                   f"Containers still get c {node.major}:{node.minor} (made from procfs's numbers), but on this "
                   f"host whatever opens {node.host_path} reaches {seen}",
                   f"rm {node.host_path} && " + _mknod_commands([node]))
    if not missing and not wrong:
        yield ok("devices.nodes", f"{len(nodes)} device nodes under {root} with the right majors and minors "
                 f"({', '.join(os.path.basename(n.path) for n in nodes[:4])}{', ...' if len(nodes) > 4 else ''})")


def check_modes(ctx: Context):
    nodes = _nodes_or_skip(ctx)
    if nodes is not None and (why := ctx.missing_root("dev")):
        yield ctx.skipped("devices.modes", why)
        return
    if nodes is None:
        yield ctx.skipped("devices.modes", "no device nodes (see devices.nodes)")
        return
    bad = []
    for node in nodes:
        try:
            mode = stat.S_IMODE(os.stat(node.host_path).st_mode)
        except OSError:
            continue
        need = 0o004 if "/nvidia-caps/" in node.path else 0o006
        if mode & need != need:
            bad.append((node, mode, need))
    for node, mode, need in bad:
        want = "0444" if need == 0o004 else "0666"
        yield warn("devices.modes",
                   f"{node.host_path} has mode {mode:04o}: non-root container users cannot open it "
                   f"(containers get the host's mode)",
                   f"chmod {want} {node.host_path} (and NVreg_DeviceFileMode=0666 in /etc/modprobe.d to keep it)")
    if not bad:
        yield ok("devices.modes", "every device node is open to non-root container users (0666, caps 0444)")


def check_char_links(ctx: Context):
    """/dev/char/M:m links: systemd resolves DeviceAllow= through them on daemon-reload."""
    nodes = _nodes_or_skip(ctx)
    if nodes is None:
        yield ctx.skipped("devices.char-links", "no device nodes (see devices.nodes)")
        return
    if why := ctx.missing_root("dev"):
        yield ctx.skipped("devices.char-links", why)
        return
    links_root = ctx.config.dev_char_root  # the host's /dev unless a dev root is set
    char_dir = os.path.join(links_root, "dev/char")
    absent = [n for n in nodes if os.path.exists(n.host_path) and not _links_to(char_dir, n, links_root)]
    fix = _CHAR_LINKS_FIX
    if os.path.normpath(links_root) != "/":
        fix += f" --dev-root {links_root}"
    if absent:
        yield warn("devices.char-links",
                   f"no {char_dir}/M:m link for {_some(f'{n.major}:{n.minor}' for n in absent)}: "
                   f"after 'systemctl daemon-reload' running GPU containers lose their devices "
                   f"(\"Failed to initialize NVML: Unknown Error\")", fix)
    else:
        yield ok("devices.char-links", f"{char_dir} links every NVIDIA device node")


def check_persistence(ctx: Context):
    if ctx.version is None or not ctx.gpus:
        yield ctx.skipped("devices.persistence", "no GPUs (see driver.gpus)")
        return
    if not ctx.options.deep:
        socket = ctx.driver.host_path("/run/nvidia-persistenced/socket")
        daemon = "nvidia-persistenced's socket is present" if os.path.exists(socket) else \
            "no nvidia-persistenced socket"
        yield info("devices.persistence", f"persistence mode not queried ({daemon}); --deep asks NVML per GPU")
        return
    off, unknown = [], []
    try:
        with ctx.driver.nvml() as nvml:
            for g in ctx.gpus:
                try:
                    if not nvml.persistence_mode(nvml.handle_by_uuid(g.uuid)):
                        off.append(g.index)
                except NvctError:  # a GPU NVML does not see: driver.nvml-devices says why
                    unknown.append(g.index)
    except NvctError as e:
        yield info("devices.persistence", f"persistence mode unknown: {e}")
        return
    also = f" (unknown for GPU(s) {', '.join(map(str, unknown))}, which NVML does not see: see " \
           f"driver.nvml-devices)" if unknown else ""
    if off:
        yield warn("devices.persistence",
                   f"persistence mode is off on GPU(s) {', '.join(map(str, off))}: each container start "
                   f"may wait seconds for the GPU to initialize{also}",
                   "systemctl enable --now nvidia-persistenced (or: nvidia-smi -pm 1)")
    elif len(unknown) == len(ctx.gpus):
        yield info("devices.persistence", f"persistence mode unknown: NVML sees none of the GPUs{also}")
    else:
        which = f"{len(ctx.gpus) - len(unknown)} of" if unknown else "all"
        yield ok("devices.persistence", f"persistence mode is on for {which} {len(ctx.gpus)} GPU(s){also}")


def _nodes_or_skip(ctx: Context):
    if ctx.version is None or ctx.gpus is None:
        return None
    try:
        return expected_nodes(ctx)
    except NvctError:
        return None


def _links_to(char_dir: str, node, links_root: str) -> bool:
    """Whether ``char_dir``'s link for ``node`` leads to it (absolute targets as seen from ``links_root``)."""
    link = os.path.join(char_dir, f"{node.major}:{node.minor}")
    try:
        target = os.readlink(link)
    except OSError:
        return False
    if os.path.isabs(target):
        target = os.path.join(links_root, target.lstrip("/")) if links_root not in ("", "/") else target
    else:
        target = os.path.join(char_dir, target)
    return os.path.normpath(target) == os.path.normpath(node.host_path)


def _what(nodes) -> str:
    """What the host's tools lose without ``nodes``: the driver (control node), or some GPUs."""
    if any(n.path == "/dev/nvidiactl" for n in nodes):
        return "the driver (no /dev/nvidiactl)"
    gpus = [n.path[len("/dev/nvidia"):] for n in nodes if n.path[len("/dev/nvidia"):].isdigit()]
    if gpus:
        return "the GPU(s) of minor " + ", ".join(gpus)
    return "those devices (" + ", ".join(os.path.basename(n.path) for n in nodes[:3]) + ")"


def _some(items, shown: int = 6) -> str:
    items = list(items)
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def _describe(st: os.stat_result) -> str:
    if stat.S_ISCHR(st.st_mode):
        return f"c {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if stat.S_ISBLK(st.st_mode):
        return f"b {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(st.st_mode) else "not a device"


#: The host's root, whose /dev nvct does not use when the dev root is elsewhere (tests move it).
HOST_ROOT = "/"


def in_host_dev(nodes) -> bool:
    """Whether the host's /dev holds every node, with the right major and minor."""
    for node in nodes:
        try:
            st = os.stat(os.path.join(HOST_ROOT, node.path.lstrip("/")))
        except OSError:
            return False
        if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != (node.major, node.minor):
            return False
    return True


def _in_host_dev_fix(ctx: Context, missing) -> str | None:
    """With another dev root, nodes that are all in the host's /dev: point nvct there instead."""
    if os.path.normpath(ctx.driver.dev_root) == os.path.normpath(HOST_ROOT) or not in_host_dev(missing):
        return None
    return ctx.set_command("nvct.dev-root", "/") + " (the nodes are in the host's /dev)"


def _mknod_commands(nodes) -> str:
    dirs = sorted({os.path.dirname(n.host_path) for n in nodes})
    dirs = [d for d in dirs if not os.path.isdir(d)]
    parts = [f"mkdir -p {' '.join(dirs)}"] if dirs else []
    for n in nodes:
        mode = "444" if "/nvidia-caps/" in n.path else "666"  # the driver's defaults
        parts.append(f"mknod -m {mode} {n.host_path} c {n.major} {n.minor}")
    return " && ".join(parts)


CHECKS = (check_majors, check_nodes, check_modes, check_char_links, check_persistence)
