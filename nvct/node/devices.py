"""Node setup: the NVIDIA device nodes and their ``/dev/char`` links (``nvct system``).

Without udev rules for them, a host may lack the control nodes
(``nvidiactl``, ``nvidia-uvm``...) until something opens the driver, and the
``/dev/char/MAJOR:MINOR`` links that runc's systemd cgroup driver resolves
device rules through: without those, ``systemctl daemon-reload`` makes
systemd drop the device rules of running containers, which then lose their
GPUs. Majors come from ``<proc-root>/devices`` (``nvidia-uvm`` and
``nvidia-caps`` are dynamic), minors and modes from the driver's ``/proc``
files. Every step is idempotent: what is already right is left alone, what
is in the way is reported and never replaced.
"""

from __future__ import annotations

import os
import stat

from nvct.base.errors import DriverError
from nvct.base.record import Record
from nvct.discover import procfs
from nvct.discover.driver import CTL_MINOR, MODESET_MINOR

UVM_MINOR = 0
UVM_TOOLS_MINOR = 1
CONTROL_MODE = 0o666
#: nvidia-modprobe's modes for the MIG capability nodes when /proc does not say.
CAP_MODES = {"config": 0o400, "monitor": 0o444}
#: Device names the reference leaves out of /dev/char (not GPU devices).
_NOT_LINKED = ("nvidia-fs", "nvidia-nvswitch", "nvidia-nvlink")


class DeviceNode(Record):
    """A character device node; ``path`` is as on a host (``/dev/...``), under the dev root."""

    __slots__ = ("path", "major", "minor", "mode")
    _defaults = {"mode": CONTROL_MODE}
    path: str
    major: int
    minor: int
    mode: int


class Action(Record):
    """One thing done (or, in a dry run, to be done); ``problem`` actions make the command fail."""

    __slots__ = ("verb", "what", "problem")
    _defaults = {"problem": False}
    verb: str
    what: str
    problem: bool

    def __str__(self) -> str:
        return f"{self.verb} {self.what}"


# --------------------------------------------------------------------------- which nodes


def control_nodes(proc_root: str) -> list[DeviceNode]:
    """nvidiactl, nvidia-modeset, nvidia-uvm(-tools) and the MIG config/monitor capabilities."""
    majors = procfs.char_majors(proc_root)
    nvidia = majors.get("nvidia-frontend", majors.get("nvidia"))
    if nvidia is None:
        raise DriverError(f"{proc_root}/devices: no 'nvidia' character device "
                          f"(is the NVIDIA kernel module loaded?)")
    nodes = [DeviceNode("/dev/nvidiactl", nvidia, CTL_MINOR),
             DeviceNode("/dev/nvidia-modeset", nvidia, MODESET_MINOR)]
    uvm = majors.get("nvidia-uvm")
    if uvm is not None:
        nodes += [DeviceNode("/dev/nvidia-uvm", uvm, UVM_MINOR),
                  DeviceNode("/dev/nvidia-uvm-tools", uvm, UVM_TOOLS_MINOR)]
    return nodes + _mig_control_nodes(proc_root, majors.get("nvidia-caps"))


def missing_modules(proc_root: str) -> list[str]:
    """Optional modules whose nodes :func:`control_nodes` had to leave out."""
    majors = procfs.char_majors(proc_root)
    return [name for name in ("nvidia-uvm", "nvidia-caps") if name not in majors]


def all_possible_nodes(proc_root: str) -> list[DeviceNode]:
    """Every node the loaded driver can have: control nodes, each GPU, each GPU's MIG capabilities."""
    nodes = control_nodes(proc_root)
    majors = procfs.char_majors(proc_root)
    nvidia = nodes[0].major
    caps = majors.get("nvidia-caps")
    minors = procfs.mig_minors(proc_root) if caps is not None else {}
    for gpu in procfs.gpus(proc_root):
        nodes.append(DeviceNode(f"/dev/nvidia{gpu.minor}", nvidia, gpu.minor))
        prefix = f"gpu{gpu.minor}/"
        for name, minor in sorted(minors.items(), key=lambda item: item[1]):
            if name.startswith(prefix):
                nodes.append(DeviceNode(f"/dev/nvidia-caps/nvidia-cap{minor}", caps, minor, 0o444))
    return nodes


def existing_nodes(dev_root: str) -> list[DeviceNode]:
    """The NVIDIA character devices under ``<dev-root>/dev`` (top level and nvidia-caps)."""
    out = []
    for directory in ("/dev", "/dev/nvidia-caps"):
        try:
            names = sorted(os.listdir(_host(dev_root, directory)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if not name.startswith("nvidia") or name.startswith(_NOT_LINKED):
                continue
            path = f"{directory}/{name}"
            try:
                st = os.stat(_host(dev_root, path))
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                out.append(DeviceNode(path, os.major(st.st_rdev), os.minor(st.st_rdev),
                                      stat.S_IMODE(st.st_mode)))
    return out


def _mig_control_nodes(proc_root: str, caps_major: int | None) -> list[DeviceNode]:
    if caps_major is None:
        return []
    table = None  # mig-minors, ~4300 lines: read only where the capability file lacks the minor
    out = []
    for name, default_mode in CAP_MODES.items():
        fields = _capability_file(proc_root, name)
        minor = _int(fields.get("DeviceFileMinor"), None)
        if minor is None:
            table = procfs.mig_minors_table(proc_root) if table is None else table
            minor = procfs.mig_minor(table, name)
        if minor is None:
            continue
        mode = _int(fields.get("DeviceFileMode"), default_mode) or 0  # never None: the default is not
        out.append(DeviceNode(f"/dev/nvidia-caps/nvidia-cap{minor}", caps_major, minor, mode & 0o777))
    return out


def _capability_file(proc_root: str, name: str) -> dict[str, str]:
    try:
        with open(os.path.join(proc_root, "driver/nvidia/capabilities/mig", name), encoding="utf-8") as f:
            return procfs.parse_information(f.read())
    except OSError:
        return {}


def _int(text: str | None, default: int | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else default


# --------------------------------------------------------------------------- doing it


def create_device_nodes(nodes: list[DeviceNode], dev_root: str, *, dry_run: bool = False) -> list[Action]:
    """mknod each node under ``dev_root`` unless the right device is already there."""
    out = []
    for node in nodes:
        host = _host(dev_root, node.path)
        try:
            st = os.lstat(host)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(node.major, node.minor):
                out.append(Action("exists", host))
            else:
                out.append(Action("conflict:", f"{host} exists but is not the character device "
                                  f"{node.major}:{node.minor} ({_kind(st)}); left alone", problem=True))
            continue
        if dry_run:
            out.append(Action("would create", _described(host, node)))
            continue
        try:
            os.makedirs(os.path.dirname(host), mode=0o755, exist_ok=True)
            os.mknod(host, stat.S_IFCHR | node.mode, os.makedev(node.major, node.minor))
            os.chmod(host, node.mode)  # mknod's mode went through the umask
        except OSError as e:
            raise DriverError(f"{host}: cannot create the device node: {e.strerror}") from None
        out.append(Action("created", _described(host, node)))
    return out


def create_dev_char_links(nodes: list[DeviceNode], dev_root: str, dev_char_path: str | None = None, *,
                          dry_run: bool = False) -> list[Action]:
    """``<dev-char-path>/MAJOR:MINOR`` -> the node, as a relative link (valid wherever /dev is mounted)."""
    directory = dev_char_path or _host(dev_root, "/dev/char")
    out = []
    if nodes and not dry_run:
        try:
            os.makedirs(directory, mode=0o755, exist_ok=True)
        except OSError as e:
            raise DriverError(f"{directory}: cannot create the directory: {e.strerror}") from None
    for node in nodes:
        link = os.path.join(directory, f"{node.major}:{node.minor}")
        target = os.path.relpath(_host(dev_root, node.path), directory)
        try:
            current = os.readlink(link)
        except FileNotFoundError:
            current = None
        except OSError:  # exists, not a link
            out.append(Action("conflict:", f"{link} exists and is not a symlink; left alone", problem=True))
            continue
        if current == target:
            out.append(Action("exists", f"{link} -> {target}"))
            continue
        verb = "would link" if dry_run else "linked"
        if current is not None:
            verb = "would replace" if dry_run else "replaced"
        if not dry_run:
            _symlink_atomic(target, link)
        was = f" (was -> {current})" if current is not None else ""
        out.append(Action(verb, f"{link} -> {target}{was}"))
    return out


def _symlink_atomic(target: str, link: str) -> None:
    tmp = f"{link}.nvct-{os.getpid()}"
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise DriverError(f"{link}: cannot create the symlink: {e.strerror}") from None


def _host(root: str, path: str) -> str:
    return os.path.join(root or "/", path.lstrip("/"))


def _described(host: str, node: DeviceNode) -> str:
    return f"{host} (c {node.major}:{node.minor}, mode {node.mode:04o})"


def _kind(st: os.stat_result) -> str:
    if stat.S_ISCHR(st.st_mode):
        return f"character device {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return "a file"
