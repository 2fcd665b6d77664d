"""Device nodes of a simulated node, at the majors and minors a driver uses.

Major 195 is fixed; nvidia-uvm, nvidia-caps, nvidia-caps-imex-channels (and
nvidia-nvswitch) get dynamic majors on a real host, announced in
/proc/devices: the simulated node picks plausible fixed ones and writes
them there, so tools that read /proc/devices find consistent numbers.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from nvct.base.errors import NvctError
from nvct.simulate.driver import Driver
from nvct.simulate.topology import Topology

FRONTEND_MAJOR = 195
DRM_MAJOR = 226
UVM_MAJOR = 510
CAPS_MAJOR = 511
IMEX_MAJOR = 509
NVSWITCH_MAJOR = 508
CTL_MINOR = 255
MODESET_MINOR = 254
#: DRM render minors are 128-191: one per GPU for the first 64.
MAX_DRI_GPUS = 64

NEEDS_ROOT = "creating device nodes needs root (CAP_MKNOD)"


@dataclass(frozen=True)
class Node:
    path: str       # as on a host: /dev/nvidia0
    major: int
    minor: int
    mode: int
    role: str

    def to_dict(self) -> dict:
        return {"path": self.path, "type": "c", "major": self.major, "minor": self.minor,
                "mode": f"{self.mode:04o}", "role": self.role}


def majors(drv: Driver, topo: Topology) -> dict:
    """Character majors by /proc/devices name."""
    out = {drv.frontend_name: FRONTEND_MAJOR, "drm": DRM_MAJOR, "nvidia-uvm": UVM_MAJOR,
           "nvidia-caps": CAPS_MAJOR, "nvidia-caps-imex-channels": IMEX_MAJOR}
    if topo.nvswitches:
        out["nvidia-nvswitch"] = NVSWITCH_MAJOR
    return out


def plan(topo: Topology) -> list[Node]:
    """Every device node of the node, in a stable order."""
    nodes = [Node(f"/dev/nvidia{g.minor}", FRONTEND_MAJOR, g.minor, 0o666, "gpu") for g in topo.gpus]
    nodes += [
        Node("/dev/nvidiactl", FRONTEND_MAJOR, CTL_MINOR, 0o666, "control"),
        Node("/dev/nvidia-modeset", FRONTEND_MAJOR, MODESET_MINOR, 0o666, "modeset"),
        Node("/dev/nvidia-uvm", UVM_MAJOR, 0, 0o666, "uvm"),
        Node("/dev/nvidia-uvm-tools", UVM_MAJOR, 1, 0o666, "uvm"),
        Node("/dev/nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, 0o400, "mig-config"),
        Node("/dev/nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, 0o444, "mig-monitor"),
    ]
    for m in topo.mig_devices:
        for minor in (m.gi_cap_minor, m.ci_cap_minor):
            nodes.append(Node(f"/dev/nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, minor, 0o444, "mig-access"))
    nodes += [Node(f"/dev/nvidia-caps-imex-channels/channel{n}", IMEX_MAJOR, n, 0o666, "imex-channel")
              for n in range(topo.imex_channels)]
    if topo.nvswitches:
        nodes.append(Node("/dev/nvidia-nvswitchctl", NVSWITCH_MAJOR, CTL_MINOR, 0o666, "nvswitch"))
        nodes += [Node(f"/dev/nvidia-nvswitch{n}", NVSWITCH_MAJOR, n, 0o666, "nvswitch")
                  for n in range(topo.nvswitches)]
    for g in topo.gpus[:MAX_DRI_GPUS]:
        nodes.append(Node(f"/dev/dri/card{g.index}", DRM_MAJOR, g.index, 0o660, "dri"))
        nodes.append(Node(f"/dev/dri/renderD{128 + g.index}", DRM_MAJOR, 128 + g.index, 0o660, "dri"))
    return nodes


def create(root: str, topo: Topology, nodes: list[Node]) -> None:
    """mknod every node under ``root`` (chmod after: the umask must not win)."""
    for node in nodes:
        path = root + node.path
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        os.chmod(parent, 0o755)
        try:
            os.mknod(path, stat.S_IFCHR | node.mode, os.makedev(node.major, node.minor))
        except PermissionError:
            raise NvctError(NEEDS_ROOT) from None
        except OSError as e:
            if e.errno == errno.EPERM:
                raise NvctError(NEEDS_ROOT) from None
            raise NvctError(f"{path}: cannot create device node: {e.strerror}") from None
        os.chmod(path, node.mode)
    # udev's names that tie a DRM node to its GPU.
    by_path = os.path.join(root, "dev/dri/by-path")
    os.makedirs(by_path, exist_ok=True)
    for g in topo.gpus[:MAX_DRI_GPUS]:
        os.symlink(f"../card{g.index}", os.path.join(by_path, f"pci-{g.bus_id}-card"))
        os.symlink(f"../renderD{128 + g.index}", os.path.join(by_path, f"pci-{g.bus_id}-render"))


def proc_devices(drv: Driver, topo: Topology) -> str:
    """/proc/devices: a typical host's majors plus the driver's."""
    char = [(1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (4, "ttyS"), (5, "/dev/tty"), (5, "/dev/console"),
            (5, "/dev/ptmx"), (7, "vcs"), (10, "misc"), (13, "input"), (29, "fb"), (128, "ptm"), (136, "pts"),
            (180, "usb"), (189, "usb_device")]
    char += [(major, name) for name, major in majors(drv, topo).items()]
    block = [(7, "loop"), (8, "sd"), (9, "md"), (65, "sd"), (66, "sd"), (67, "sd"), (68, "sd"), (69, "sd"),
             (70, "sd"), (71, "sd"), (128, "sd"), (129, "sd"), (130, "sd"), (131, "sd"), (132, "sd"),
             (133, "sd"), (134, "sd"), (135, "sd"), (253, "device-mapper"), (254, "mdp"), (259, "blkext")]
    lines = ["Character devices:"] + [f"{m:3d} {n}" for m, n in sorted(char, key=lambda x: x[0])]
    lines += ["", "Block devices:"] + [f"{m:3d} {n}" for m, n in block]
    return "\n".join(lines) + "\n"
