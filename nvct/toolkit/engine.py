"""The container engine's side of an installation: its config, and its daemon picking it up.

The config is edited through :mod:`nvct.engines` (``nvidia``,
``nvidia-cdi`` and ``nvidia-legacy`` in one transaction, undone from its
record, byte for byte). How the daemon learns of it (``--restart-mode``):

* docker, ``signal``: SIGHUP to dockerd (found through its socket), then
  ``GET /info`` until the runtimes show. dockerd keeps ``runtimes`` and
  ``default-runtime`` when it reloads a file without them -- and 20.10 panics
  at a later reload whose runtimes lack the default it kept -- so removal
  first reloads the original file with ``"runtimes": {}`` and
  ``"default-runtime": "runc"`` made explicit, then puts the original bytes
  back (same effective settings, no reload needed);
* containerd, ``signal``: containerd (1.6, 1.7) ignores SIGHUP; nvct says
  that it must be restarted and does not send it;
* ``systemd``: ``systemctl restart <unit>`` on the host (through ``chroot
  --host-root``); cri-o supports only this (its default) or ``none``;
* ``none``: nothing; the daemon applies the change at its next restart.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from typing import AbstractSet, Callable

from nvct import engines as runtimes
from nvct.base.errors import NvctError
from nvct.base.fileutil import write_atomic
from nvct.engines.change import Change
from nvct.engines.document import JsonDocument
from nvct.engines.engine import read_file
from nvct.toolkit import daemons
from nvct.toolkit.layout import Layout
from nvct.toolkit.options import Options

#: What the reference appends to the engine's own low-level runtimes.
DEFAULT_LOW_LEVEL = ("runc", "crun")


class EngineSetup:
    """Configure ``opts.runtime`` for the toolkit at ``layout``, and undo it."""

    def __init__(self, opts: Options, layout: Layout, log: Callable[[str], None]):
        self.opts = opts
        self.layout = layout
        self.log = log
        self.runtimes = layout.runtimes(opts.nvidia_runtime_name)
        #: Whose layer of the undo record this installer's changes are: its and its successors'
        #: (a restarted installer takes over a killed one's), never ``nvct runtime configure``'s.
        self.owner = runtimes.installer_owner(layout.root)
        self._change: Change | None = None
        #: time.monotonic() of this installer's own restart of the daemon (None: it did not restart it).
        self.restarted_at: float | None = None
        #: Whether the daemon runs with (or was told of) this installer's config: else its undo
        #: tells it nothing (a failed restart leaves the daemon on the config it had).
        self._applied = False

    # --- what the installed config needs from the engine ---
    def low_level_runtimes(self) -> list[str]:
        """``--nvidia-container-runtime.runtimes``, else the engine's default/runc/crun binaries + runc, crun."""
        if self.opts.low_level_runtimes:
            return list(self.opts.low_level_runtimes)
        found: list[str] = []
        if self.opts.enable_nri_plugin:  # no engine config to read: the last install's, as the reference
            found = _installed_runtimes(self.layout.config())
        elif not self.opts.no_runtime_config and not self._hook_mode:
            found = runtimes.low_level_runtime_paths(self.opts.runtime, self.opts.config, **self._source())
        return list(dict.fromkeys(found + list(DEFAULT_LOW_LEVEL)))

    # --- install / remove ---
    def configure(self) -> None:
        """Write the engine's config (and the undo record beside it)."""
        opts = self.opts
        if self._hook_mode:
            self._report(runtimes.configure_hook(self._hook_file, self.layout.hook, owner=self.owner))
            return
        drop_in = runtimes.DEFAULT if opts.drop_in_config is None else opts.drop_in_config
        if opts.runtime == "docker" and opts.drop_in_config:
            self.log(f"ignoring --drop-in-config={opts.drop_in_config}: docker reads no drop-in files")
            drop_in = runtimes.DEFAULT
        change = runtimes.configure(
            opts.runtime, opts.config, self.runtimes,
            set_default=opts.nvidia_runtime_name if opts.set_as_default else None,
            cdi=bool(opts.enable_cdi_in_runtime) and opts.runtime != "crio", drop_in=drop_in,
            options=runtimes.Options(
                runtime_type=opts.runtime_type,
                container_annotations=[p + "*" for p in opts.cdi_annotation_prefixes],
                runtime_overrides=opts.runtime_config_override,
                drop_in_host_path=opts.drop_in_config_host_path),
            owner=self.owner, **self._source())
        self._report(change)
        self._change = change

    def apply(self) -> None:
        """Make the daemon pick the configured runtimes up, unless it already runs with them.

        "Already" is what this module's restart marker says: the config files
        hash as they did when an installer last restarted the daemon for them
        (the marker lives beside the pid file, in /run: a reboot forgets it).
        That is what keeps a DaemonSet from restarting containerd in a loop
        when containerd >= 1.6.9 stops the installer right after its restart.
        """
        if self._hook_mode:
            return
        marker = self._restart_marker
        digest = self._config_digest()
        if self.opts.restart_mode == "systemd" and not (self._change and self._change.changed):
            if digest is not None and _read(marker) == digest:
                self.log(f"{self.opts.runtime} already runs with this config (restarted for it by an earlier "
                         f"installer, see {marker}): not restarting it")
                self._applied = True
                return
        self._apply(signal_attempts=self.opts.signal_attempts, configured=True)
        self._applied = True
        if self.opts.restart_mode == "systemd":
            self.restarted_at = time.monotonic()
            if digest is not None:
                _write_marker(marker, digest)

    def cleanup(self) -> None:
        """Put the engine's config back as it was, and make the daemon forget the runtimes."""
        opts = self.opts
        if self._hook_mode:
            self._report(runtimes.unconfigure_hook(self._hook_file, owner=self.owner))
            return
        drop_in = runtimes.DEFAULT if opts.drop_in_config is None or opts.runtime == "docker" else opts.drop_in_config
        change = runtimes.unconfigure(opts.runtime, opts.config, tuple(self.runtimes), drop_in=drop_in,
                                      owner=self.owner)
        self._report(change)
        _remove(self._restart_marker)
        if not self._applied:
            self.log(f"{opts.runtime} was not told of the config this installer wrote: not telling it again")
        elif opts.runtime == "docker" and opts.restart_mode == "signal":
            self._reload_docker_after_removal()
        else:
            self._apply(signal_attempts=1, configured=False)

    # --- the daemon ---
    def _apply(self, *, signal_attempts: int, configured: bool) -> None:
        opts = self.opts
        if opts.restart_mode == "none":
            self.log(f"not restarting {opts.runtime} (--restart-mode=none): it applies {opts.config} "
                     f"when it next restarts")
            return
        if opts.restart_mode == "systemd":
            try:
                argv = daemons.systemctl_restart(opts.service, opts.host_root)
            except daemons.DaemonError as e:
                if not daemons.systemd_reachable(opts.host_root, str(e)):
                    raise daemons.DaemonError(f"{e}; no systemd runs on the host: set {_instead(opts.runtime)} "
                                              f"and restart {opts.runtime} yourself") from None
                raise
            self.log(f"restarted {opts.service}: {' '.join(argv)}")
        elif opts.runtime == "containerd":
            self.log(f"containerd does not reload its config on SIGHUP: restart containerd to apply "
                     f"{opts.config} (or run with --restart-mode=systemd)")
            return
        else:
            self._sighup(signal_attempts)
        self._applied = True  # told, even if the wait below fails: the undo must tell it again
        if opts.runtime == "docker":
            if configured:
                default = opts.nvidia_runtime_name if opts.set_as_default else None
                self._wait_docker(present=set(self.runtimes), default=default)
            else:
                self._wait_docker(absent=set(self.runtimes), default=self._default_in_file())

    def _reload_docker_after_removal(self) -> None:
        """Reload dockerd without leaving it on a runtime that is gone (see the module's docstring)."""
        path = self.opts.config
        original = read_file(path)
        doc = JsonDocument(path, original)
        data = doc.data()
        interim = "runtimes" not in data or "default-runtime" not in data
        if interim:
            doc.set(("runtimes",), data.get("runtimes", {}))
            doc.set(("default-runtime",), data.get("default-runtime", "runc"))
            write_atomic(path, doc.render())
            self.log(f"reloading dockerd with {path}'s runtimes and default-runtime made explicit "
                     f"(dockerd keeps what a reloaded file leaves out), then restoring it")
        try:
            self._sighup(1)
            self._wait_docker(absent=set(self.runtimes), default=doc.get(("default-runtime",)))
        except NvctError as e:
            self.log(f"warning: {e}; restart dockerd before it next reloads its config")
        finally:
            if interim:
                _restore(path, original)
                self.log(f"restored {path}")

    def _sighup(self, attempts: int) -> None:
        opts = self.opts
        for attempt in range(1, attempts + 1):
            try:
                pid = daemons.daemon_pid(opts.socket, opts.runtime_pid_file)
                os.kill(pid, signal.SIGHUP)
            except (daemons.DaemonError, OSError) as e:
                why = str(e) if isinstance(e, NvctError) else f"signal: {e.strerror}"
                if attempt == attempts or isinstance(e, daemons.RefusedPid):
                    raise daemons.DaemonError(f"cannot signal {opts.runtime}: {why}") from None
                self.log(f"cannot signal {opts.runtime} yet (attempt {attempt}/{attempts}): {why}")
                time.sleep(opts.signal_backoff)
                continue
            self.log(f"sent SIGHUP to {opts.runtime} (pid {pid}, found through "
                     f"{opts.runtime_pid_file or opts.socket})")
            return

    def _wait_docker(self, *, present: AbstractSet[str] = frozenset(), absent: AbstractSet[str] = frozenset(),
                     default: str | None = None) -> None:
        deadline = time.monotonic() + self.opts.reload_timeout
        last = "no answer"
        while True:
            try:
                info = daemons.docker_info(self.opts.socket)
                names = set(info.get("Runtimes") or {})
                current = info.get("DefaultRuntime")
                if present <= names and not absent & names and default in (None, current):
                    self.log(f"dockerd applied {self.opts.config}: runtimes {', '.join(sorted(names))}; "
                             f"default {current}")
                    return
                last = f"runtimes {', '.join(sorted(names))}; default {current}"
            except daemons.DaemonError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise daemons.DaemonError(f"dockerd did not apply {self.opts.config} within "
                                          f"{self.opts.reload_timeout:g}s ({last}); see dockerd's log")
            time.sleep(0.1)

    # --- helpers ---
    @property
    def _restart_marker(self) -> str:
        return os.path.join(os.path.dirname(self.opts.pid_file), f"nvct-restarted-{self.opts.runtime}")

    def _config_digest(self) -> str | None:
        """sha256 over the files configure manages (their paths and bytes); None if unknown."""
        if self._change is None:
            return None

        digest = hashlib.sha256()
        for path in sorted(f.path for f in self._change.files):
            digest.update(path.encode() + b"\0" + (read_file(path) or b"") + b"\0")
        return digest.hexdigest()

    @property
    def _hook_mode(self) -> bool:
        return self.opts.runtime == "crio" and self.opts.crio_config_mode == "hook"

    @property
    def _hook_file(self) -> str:
        return os.path.join(self.opts.crio_hooks_dir, self.opts.crio_hook_filename)

    def _source(self) -> dict:
        source = "file" if self.opts.runtime == "docker" else self.opts.config_source
        return {"config_source": source, "executable": self.opts.executable_path if source == "command" else None}

    def _default_in_file(self) -> str:
        data = JsonDocument(self.opts.config, read_file(self.opts.config)).data()
        return data.get("default-runtime", "runc")

    def _report(self, change) -> None:
        for note in change.notes:
            self.log(note)
        if not change.changed:
            self.log(f"{change.anchor}: already as wanted")
        for path in change.written:
            self.log(f"{'removed' if not os.path.exists(path) else 'wrote'} {path}")


def _installed_runtimes(config: str) -> list[str]:
    """``nvidia-container-runtime.runtimes`` of an installed config.toml; none if it is absent or unreadable."""
    from nvct.config.file import parse_toml

    try:
        with open(config, "rb") as f:
            data = parse_toml(f.read(), config)
    except (OSError, NvctError):  # ConfigError is one
        return []
    found = data.get("nvidia-container-runtime", {})
    found = found.get("runtimes", []) if isinstance(found, dict) else []
    return [r for r in found if isinstance(r, str) and r] if isinstance(found, list) else []


def _instead(engine: str) -> str:
    """The restart mode to set where systemd cannot restart ``engine``, as variable and flag."""
    mode = "signal" if engine == "docker" else "none"
    return f"RUNTIME_RESTART_MODE={mode} (--restart-mode={mode})"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _write_marker(path: str, digest: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, (digest + "\n").encode())


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _restore(path: str, original: bytes | None) -> None:
    if original is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    else:
        write_atomic(path, original)
