"""The node installer (``nvct toolkit install``), as the GPU Operator's container-toolkit DaemonSet runs it.

It copies nvct to ``<install-dir>/toolkit`` (wrappers the host runs with
its own python3), writes the config there with the node's driver root,
adds the ``nvidia``, ``nvidia-cdi`` and ``nvidia-legacy`` runtimes to
docker, containerd or CRI-O, makes the daemon pick them up, and on SIGTERM
undoes all of it -- the engine's config byte for byte. See docs/installer.md.

::

    from nvct.toolkit import Options, Installation, run

    run(Options(runtime="containerd", driver_root="/"))       # the CLI: lock, install, wait, undo
    inst = Installation(Options(...)); inst.install(); ...; inst.uninstall()
"""

from nvct.toolkit.install import Installation, Interrupted, check_host_python
from nvct.toolkit.layout import Layout
from nvct.toolkit.lifecycle import READY_MESSAGE, StopSignals, run
from nvct.toolkit.options import Options
from nvct.toolkit.pidfile import PidFile, PidFileLocked

__all__ = ["Installation", "Interrupted", "Layout", "Options", "PidFile", "PidFileLocked", "READY_MESSAGE",
           "StopSignals", "check_host_python", "run"]
