"""One installation: the steps of ``nvct toolkit install``, each with its undo.

1. the toolkit tree (wrappers, configs, a Python runtime and a copy of nvct in
   a new ``.runtime/<version>``), switched to with renames, so an upgrade
   never leaves a half-written tree where running daemons look for it. What
   it holds runs as root at every GPU container start: it is made root-owned
   and writable by root alone whatever the umask, and checked so (with
   :func:`nvct.linux.ownership.weakness`, also above it) before it is
   switched in;
2. a check that the installed ``nvct`` runs on the host (chrooted into it);
3. with ``--cdi-enabled``: the control device nodes and a management CDI spec;
4. the engine's config, then the daemon told about it.

A failing step undoes the ones before it, as does :meth:`Installation.uninstall`
(the installer's SIGTERM): the engine's config goes back byte for byte,
the spec and the toolkit tree are removed. Device nodes stay (they belong
to the node, not to the installation).
"""

from __future__ import annotations

import compileall
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from typing import Callable

from nvct import __version__
from nvct.base.errors import NvctError
from nvct.base.fileutil import remove_path
from nvct.linux import ownership
from nvct.toolkit import configfile, payload, python as runtime, wrappers
from nvct.toolkit.engine import EngineSetup
from nvct.toolkit.layout import RUNTIME_MODES, RUNTIMES_DIR, TOOLS, Layout
from nvct.toolkit.options import Options

HOST_CHECK_TIMEOUT_S = 60
_NEEDS = "the host needs python3 >= 3.9 (--python; see docs/installer.md)"
_NEEDS_BUNDLED = "the toolkit's own Python did not start there (see docs/installer.md)"


class Interrupted(NvctError):
    """A stop signal came during the installation (what was done is undone)."""


def stderr_log(message: str) -> None:
    sys.stderr.write(f"nvct toolkit: {message}\n")
    sys.stderr.flush()


class Installation:
    """``Installation(opts).install()``, later ``.uninstall()``."""

    def __init__(self, opts: Options, log: Callable[[str], None] = stderr_log):
        self.opts = opts.resolved()
        self.log = log
        self.layout = Layout.for_install_dir(self.opts.install_dir)
        self.engine = EngineSetup(self.opts, self.layout, log)
        self.cdi_spec: str | None = None
        self._undo: list = []

    def install(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Every step; when one fails (or ``should_stop()``), the ones done are undone and it re-raises."""
        opts = self.opts
        steps = [(self._install_files, self._remove_files), (self._check_host, None)]
        if opts.cdi_enabled:
            if "control" in opts.create_device_nodes and not {"", "none"} & set(opts.create_device_nodes):
                steps.append((self._create_device_nodes, None))
            if opts.cdi_output_dir:
                steps.append((self._write_cdi_spec, self._remove_cdi_spec))
        if not opts.no_runtime_config:
            steps += [(self.engine.configure, self.engine.cleanup), (self.engine.apply, None)]
        try:
            for do, undo in steps:
                if should_stop():
                    raise Interrupted("stopped by a signal during the installation")
                do()
                if undo is not None:
                    self._undo.append(undo)
        except BaseException:
            self.uninstall()
            raise

    def uninstall(self) -> None:
        """Undo every step done, last first; carry on past failures, then report them."""
        errors = []
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except NvctError as e:
                errors.append(str(e))
                self.log(f"error: {e}")
            except OSError as e:
                errors.append(f"{e.filename or ''}: {e.strerror or e}")
                self.log(f"error: {errors[-1]}")
        if errors:
            raise NvctError(f"could not undo everything: {'; '.join(errors)}")

    # --- the toolkit tree ---
    def _install_files(self) -> None:
        """A new ``.runtime/<version>`` with everything, then the wrappers and configs switched to it.

        A first install builds the whole tree beside ``root`` and renames it in. An upgrade builds
        the new runtime beside the running one, then replaces each wrapper and config with one
        ``rename``: a container start sees the old complete runtime or the new one, never a mix.
        The runtime before the new one stays (a hook that started a moment ago may still import
        from it); older ones go.
        """
        old_umask = os.umask(0o022)  # what makedirs, compileall and open create; modes are set after too
        try:
            self._install_tree()
        finally:
            os.umask(old_umask)

    def _install_tree(self) -> None:
        runtimes = self.engine.low_level_runtimes()
        version = _new_version()
        self.layout = final = self.layout.with_version(version)
        self.engine.layout = final
        parent = os.path.dirname(final.root)
        upgrade = os.path.isdir(final.root) and not os.path.islink(final.root)
        if os.path.islink(final.root) or (os.path.lexists(final.root) and not upgrade):
            raise NvctError(f"{final.root}: exists and is not a directory; remove it first")
        _refuse(ownership.ancestor_weaknesses(final.root, (0, os.geteuid())), final.root)
        try:
            os.makedirs(final.runtimes_dir if upgrade else parent, mode=0o755, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".toolkit-new-", dir=final.runtimes_dir if upgrade else parent)
        except OSError as e:
            raise NvctError(f"{parent}: cannot create the install directory: {e.strerror}") from None
        try:
            os.chmod(staging, 0o755)
            self._populate(final.moved(staging), runtimes)
            _harden(final.root if upgrade else staging)  # an upgrade also mends the directories it writes into
            _refuse(ownership.tree_weaknesses(final.root if upgrade else staging, (os.geteuid(),)), final.root)
            if upgrade:
                _switch(staging, final)
            else:
                os.rename(staging, final.root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.log(f"installed the toolkit in {final.root} (runtime {version}; "
                 f"low-level runtimes: {', '.join(runtimes)})")

    def _populate(self, into: Layout, runtimes: list) -> None:
        """The whole tree in ``into`` (paths written into files are the final layout's)."""
        opts, final = self.opts, self.layout
        if opts.bundled:
            runtime.bundle(into.runtime_dir, (os.path.relpath(into.python_dir, into.runtime_dir),))
        payload.copy_python(into.python_dir)
        if opts.bundled:
            runtime.copy_libraries(into.runtime_dir)
            compileall.compile_dir(into.python_dir, quiet=1, ddir=final.python_dir)
            stdlib = os.path.join("lib", runtime.python_name())  # the image's pycs; any it lacks, made here
            compileall.compile_dir(os.path.join(into.runtime_dir, stdlib), quiet=1,
                                   ddir=os.path.join(final.runtime_dir, stdlib))
        else:  # by the host's Python, or its first run as root writes the __pycache__ under the engine's umask
            _compile_on_host(opts.python, into.python_dir, final.python_dir, opts.host_root)
        os.symlink(final.version, os.path.join(into.runtimes_dir, "current"))
        python = runtime.command(final.runtime_dir) if opts.bundled else opts.python
        values = configfile.settings(opts, final, runtimes)
        os.makedirs(into.config_dir, mode=0o755)
        for mode in (None,) + tuple(m for m in RUNTIME_MODES.values() if m):
            _write(into.config(mode), configfile.render(values, mode), 0o644)
        for suffix, mode in RUNTIME_MODES.items():
            _write(into.runtime(suffix), wrappers.runtime_wrapper(
                final, suffix, mode, python=python, fallback=runtimes[0], proc_root=opts.proc_root), 0o755)
        for tool in TOOLS:
            _write(into.tool(tool), wrappers.tool_wrapper(final, tool, python=python), 0o755)

    def _remove_files(self) -> None:
        if os.path.isdir(self.layout.root) and not os.path.islink(self.layout.root):
            from nvct.toolkit import standin  # stand-ins where running containers still name a wrapper

            wrappers = list(self.layout.runtimes().values())
            if not standin.remove_toolkit(self.layout.root, wrappers, standin.config_runtimes(self.layout.config()),
                                          self.log):
                self.log(f"removed {self.layout.root}")

    def _check_host(self) -> None:
        python = None if self.opts.bundled else self.opts.python
        old_umask = os.umask(0o022)  # whatever the check's Python writes into the tree
        try:
            self.log(check_host_python(self.layout, python, self.opts.host_root))
        finally:
            os.umask(old_umask)

    # --- CDI for management containers ---
    def _create_device_nodes(self) -> None:
        from nvct.node import devices as system

        proc_root = self.opts.proc_root or "/proc"
        for action in system.create_device_nodes(system.control_nodes(proc_root), self.opts.dev_root_ctr_path):
            self.log(str(action))

    def _write_cdi_spec(self) -> None:
        from nvct.cdi import generate, spec as spec_mod, transform
        from nvct.discover.driver import Driver
        from nvct.request import cdinames as names

        opts = self.opts
        vendor, cls = names.split_kind(opts.cdi_kind)
        driver = Driver(opts.driver_root_ctr_path, opts.dev_root_ctr_path, opts.proc_root or "/proc")
        raw = generate.generate(driver, hook_path=self.layout.nvct, vendor=vendor, cls=cls, mode="management")
        moves = {opts.driver_root_ctr_path: opts.driver_root, opts.dev_root_ctr_path: opts.effective_dev_root}
        for seen, host in moves.items():
            if os.path.normpath(seen) != os.path.normpath(host):
                transform.transform_root(raw, seen, host)
        self.cdi_spec = spec_mod.save(raw, os.path.join(opts.cdi_output_dir, f"{vendor}-{cls}.yaml"), "yaml")
        self.log(f"wrote the CDI spec {self.cdi_spec} ({opts.cdi_kind})")

    def _remove_cdi_spec(self) -> None:
        if self.cdi_spec:
            try:
                os.unlink(self.cdi_spec)
            except FileNotFoundError:
                pass
            self.log(f"removed {self.cdi_spec}")


def check_host_python(layout: Layout, python: str | None, host_root: str = "/") -> str:
    """Run the installed ``nvct --check`` (chrooted into ``host_root``): through its wrapper with
    the bundled runtime (``python`` None), else with the host's ``python``; its report."""
    if python is None:
        argv = [layout.nvct, "--check"]
    else:
        argv = [python, "-I", layout.entry, "nvct", layout.nvct, "--check"]
    if os.path.normpath(host_root or "/") != "/":
        argv = ["chroot", host_root] + argv
    how = " ".join(argv)
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=HOST_CHECK_TIMEOUT_S,
                              env={"PATH": wrappers.DEFAULT_PATH, "LANG": "C.UTF-8"}, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NvctError(f"the host cannot run nvct ({how}: {getattr(e, 'strerror', None) or e}); "
                        f"{_NEEDS if python else _NEEDS_BUNDLED}") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise NvctError(f"the host cannot run nvct ({how}: {lines[-1] if lines else f'exit {proc.returncode}'}); "
                        f"{_NEEDS if python else _NEEDS_BUNDLED}")
    return "host check: " + proc.stdout.decode(errors="replace").strip()


def _compile_on_host(python: str, directory: str, final: str, host_root: str = "/") -> None:
    """Byte-compile ``directory`` with the host's ``python`` (chrooted into ``host_root``, where the
    install directory has the same path); what it cannot compile is left to the host check."""
    argv = [python, "-I", "-m", "compileall", "-q", "-d", final, directory]
    if os.path.normpath(host_root or "/") != "/":
        argv = ["chroot", host_root] + argv
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=HOST_CHECK_TIMEOUT_S,
                       env={"PATH": wrappers.DEFAULT_PATH, "LANG": "C.UTF-8"}, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _harden(root: str) -> None:
    """Everything under ``root`` owned by the installer (root) and writable by it alone, whatever the
    umask and the modes of what was copied: directories 0755, files 0755 or 0644 (by their x bit)."""
    uid = os.geteuid()
    for directory, dirs, files in os.walk(root):
        for path in [directory] + [os.path.join(directory, n) for n in dirs + files]:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                if uid == 0 and (st.st_uid, st.st_gid) != (0, 0):
                    os.lchown(path, 0, 0)
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue  # refused by the check that follows
            if uid == 0 and (st.st_uid, st.st_gid) != (0, 0):
                os.lchown(path, 0, 0)
            mode = 0o755 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else 0o644
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)


def _refuse(weaknesses: list, root: str) -> None:
    """One line naming the first entry that someone other than root could change."""
    if weaknesses:
        path, why = weaknesses[0]
        more = f" (and {len(weaknesses) - 1} more)" if len(weaknesses) > 1 else ""
        raise NvctError(f"{path}: {why}{more}: anyone who can change it gets root at the next GPU container "
                        f"start, so the toolkit is not switched in at {root}")


def _write(path: str, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)


def _new_version() -> str:
    """A fresh ``.runtime`` name: nvct's version and a time stamp (later installs sort after)."""
    return f"nvct-{__version__}-{time.time_ns():x}"


def _switch(staging: str, final: Layout) -> None:
    """Move ``staging``'s runtime to ``final.runtime_dir``, then rename each wrapper, config and the
    ``current`` link over the old ones; prune what the old install had and this one does not."""
    new = final.moved(staging)
    previous = _current_version(final)
    names = set(os.listdir(staging))
    os.rename(new.runtime_dir, final.runtime_dir)
    for directory, _dirs, files in os.walk(staging):
        rel = os.path.relpath(directory, staging)
        if rel == RUNTIMES_DIR:  # its ``current`` link goes last
            continue
        os.makedirs(os.path.normpath(os.path.join(final.root, rel)), mode=0o755, exist_ok=True)
        for name in files:
            os.replace(os.path.join(directory, name), os.path.normpath(os.path.join(final.root, rel, name)))
    os.replace(os.path.join(new.runtimes_dir, "current"), os.path.join(final.runtimes_dir, "current"))
    shutil.rmtree(staging, ignore_errors=True)
    keep = {final.version, previous, "current"}
    for name in os.listdir(final.runtimes_dir):
        if name not in keep:
            remove_path(os.path.join(final.runtimes_dir, name))
    for name in set(os.listdir(final.root)) - names:  # e.g. an older nvct's lib/python
        remove_path(os.path.join(final.root, name))


def _current_version(layout: Layout) -> str | None:
    try:
        return os.readlink(os.path.join(layout.runtimes_dir, "current"))
    except OSError:
        return None

