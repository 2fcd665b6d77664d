"""The installer's life: lock the pid file, install, wait for a stop signal, undo everything.

SIGTERM (what the kubelet sends), SIGINT, SIGHUP and SIGQUIT all mean stop.
One that comes during the installation ends it at the next step and undoes
what was done; later, :meth:`StopSignals.wait` blocks the signals and
``sigwait``-s, so none can slip in between a check and the wait.
``--no-daemon`` installs and exits, undoing nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable

from nvct.toolkit.install import Installation, Interrupted, stderr_log
from nvct.toolkit.options import Options
from nvct.toolkit.pidfile import PidFile

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
#: What the tests (and the DaemonSet's logs) look for.
READY_MESSAGE = "installed; waiting for SIGTERM to undo it"
#: A stop signal this soon after the installer restarted the container engine is taken for the
#: engine's doing (containerd >= 1.6.9 stops the pod that just restarted it), not an uninstall.
RESTART_GRACE_S = 20.0


class StopSignals:
    """``with StopSignals() as stop: ... stop.requested() ... stop.wait()``."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.received: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def requested(self) -> bool:
        return self.received is not None

    def wait(self) -> int:
        """The first stop signal (at once if one came already)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        try:
            if self.received is None:
                self.received = signal.sigwait(self.signals)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        return self.received


def run(opts: Options, log: Callable[[str], None] = stderr_log) -> int:
    """The whole of ``nvct toolkit install``; raises NvctError (after undoing) on failure."""
    opts = opts.resolved()
    with StopSignals() as stop, PidFile(opts.pid_file):
        installation = Installation(opts, log)
        try:
            installation.install(stop.requested)
        except Interrupted:
            assert stop.received is not None  # what interrupted it
            log(f"stopped by {signal.Signals(stop.received).name} during the installation: undone")
            return 0
        if opts.no_daemon:
            log("installed; exiting (--no-daemon: nothing will be undone)")
            return 0
        plugin = _start_nri_plugin(opts, installation, log) if opts.enable_nri_plugin else None
        log(READY_MESSAGE)
        received = stop.wait()
        if plugin is not None:
            plugin.stop()
        restarted = installation.engine.restarted_at
        if restarted is not None and time.monotonic() - restarted < RESTART_GRACE_S:
            log(f"{signal.Signals(received).name} {time.monotonic() - restarted:.1f}s after restarting "
                f"{opts.runtime}: taken for the restart's side effect (containerd >= 1.6.9 stops the pod "
                f"that restarted it), not an uninstall; leaving everything installed")
            return 0
        log(f"{signal.Signals(received).name}: removing what was installed")
        installation.uninstall()
        from nvct.toolkit import standin

        left = standin.standins(installation.layout.root)
        log("removed everything that was installed" + (
            f", but {len(left)} stand-in(s) for running containers (above)" if left else ""))
    return 0


def _start_nri_plugin(opts: Options, installation: Installation, log: Callable[[str], None]):
    """The NRI plugin, registered with the runtime (else everything installed is undone, and it raises)."""
    from nvct.nri.plugin import PLUGIN_NAME, Plugin, Policy

    policy = Policy([opts.nri_namespace, *opts.nri_management_namespaces])
    name = os.path.basename(sys.argv[0] or "") or PLUGIN_NAME  # the reference's: its program's name
    try:
        return Plugin(opts.nri_socket, f"{opts.nri_plugin_index:02d}", policy, log, name=name).start(STOP_SIGNALS)
    except BaseException:
        installation.uninstall()
        raise
