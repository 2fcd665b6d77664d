"""The driver's character devices under the device root, as a container should see them."""

from __future__ import annotations

import os
import stat

from nvct.base.errors import DriverError
from nvct.discover.catalog import CTL_MINOR, MODESET_MINOR, NVIDIA_MAJOR
from nvct.discover.records import Gpu, Node
from nvct.discover.rootpath import join_root

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any


def _expand(pattern: str) -> list[str]:
    """``sorted(glob.glob(pattern))``; glob (and re) imported only for a pattern with wildcards."""
    if not any(c in pattern for c in "*?["):
        return [pattern] if os.path.lexists(pattern) else []
    import glob

    return sorted(glob.glob(pattern))


class _DeviceNodes:
    """Node lookups of :class:`nvct.discover.driver.Driver` (its ``dev_root``, ``majors``)."""

    dev_root: str
    proc_root: str
    majors: Any  # Driver's: /proc/devices, read on first use

    def dev_host_path(self, path: str) -> str:
        """A device-root path as seen from the host."""
        return join_root(self.dev_root, path)

    def gpu_node(self, gpu: Gpu) -> Node:
        return self._node(gpu.device_path, NVIDIA_MAJOR, gpu.minor)

    def control_nodes(self) -> list[Node]:
        """nvidiactl, uvm, uvm-tools and modeset, where the module provides them."""
        out = [self._node("/dev/nvidiactl", NVIDIA_MAJOR, CTL_MINOR)]
        uvm = self.majors.get("nvidia-uvm")
        if uvm is not None:
            out.append(self._node("/dev/nvidia-uvm", uvm, 0))
            out.append(self._node("/dev/nvidia-uvm-tools", uvm, 1))
        if os.path.exists(self.dev_host_path("/dev/nvidia-modeset")):
            out.append(self._node("/dev/nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR))
        return out

    def cap_node(self, minor: int) -> Node:
        major = self.majors.get("nvidia-caps")
        if major is None:
            raise DriverError(f"{self.proc_root}/devices: no nvidia-caps major (MIG needs the nvidia-caps device)")
        return self._node(f"/dev/nvidia-caps/nvidia-cap{minor}", major, minor, default_mode=0o444)

    def imex_channel_node(self, channel: int) -> Node:
        major = self.majors.get("nvidia-caps-imex-channels")
        if major is None:
            raise DriverError(
                f"{self.proc_root}/devices: no nvidia-caps-imex-channels major (IMEX channels requested)")
        return self._node(f"/dev/nvidia-caps-imex-channels/channel{channel}", major, channel)

    def glob_nodes(self, *patterns: str) -> list[Node]:
        """Existing character devices matching ``patterns`` under the device root (gated features)."""
        out: list[Node] = []
        for pattern in patterns:
            for host in _expand(self.dev_host_path(pattern)):
                try:
                    st = os.stat(host)
                except OSError:
                    continue
                if stat.S_ISCHR(st.st_mode):
                    path = "/" + os.path.relpath(host, self.dev_root)
                    out.append(Node(path, os.major(st.st_rdev), os.minor(st.st_rdev), host,
                                    stat.S_IMODE(st.st_mode)))
        return out

    def drm_nodes(self, gpu: Gpu) -> list[Node]:
        """The DRM card and render nodes of one GPU, through udev's by-path links."""
        out: list[Node] = []
        for suffix in ("card", "render"):
            link = self.dev_host_path(f"/dev/dri/by-path/pci-{gpu.bus_id}-{suffix}")
            if not os.path.islink(link):
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
            out.extend(n for n in self.glob_nodes("/" + os.path.relpath(target, self.dev_root)))
        return out

    def drm_links(self, gpu: Gpu) -> list[tuple[str, str]]:
        """udev's ``/dev/dri/by-path/pci-<bus id>-card|render`` links of one GPU, as (target, link),
        for those that name one of its :meth:`drm_nodes` (the reference's create-symlinks)."""
        nodes = {n.path for n in self.drm_nodes(gpu)}
        out = []
        for suffix in ("card", "render"):
            link = f"/dev/dri/by-path/pci-{gpu.bus_id}-{suffix}"
            try:
                target = os.readlink(self.dev_host_path(link))
            except OSError:
                continue
            if "::" not in target and os.path.normpath(os.path.join(os.path.dirname(link), target)) in nodes:
                out.append((target, link))
        return out

    def _node(self, path: str, major: int, minor: int, default_mode: int = 0o666) -> Node:
        host = self.dev_host_path(path)
        try:
            mode = stat.S_IMODE(os.stat(host).st_mode)
        except OSError:
            mode = default_mode
        return Node(path, major, minor, host, mode)
