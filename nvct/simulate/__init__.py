"""A simulated GPU node: a driver install with no GPU, for tests and CI.

``build_node(DIR)`` makes DIR look like a host with an NVIDIA driver loaded
(libraries and ld.so.cache, device nodes, /proc/driver/nvidia, a mock NVML,
nvidia-smi) and writes DIR/nvct-config.toml pointing nvct at it. See
docs/simulated-node.md.
"""

from nvct.simulate.driver import DEFAULT_DRIVER_VERSION
from nvct.simulate.manifest import load_manifest
from nvct.simulate.node import build_node, cached_node

__all__ = ["DEFAULT_DRIVER_VERSION", "build_node", "cached_node", "load_manifest"]
