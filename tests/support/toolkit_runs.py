"""GPU containers through the runtime wrappers of a toolkit installed with ``nvct toolkit install``.

The same starts as :func:`tests.support.gpu_runs.run_gpu`, on the simulated
node, but through what a GPU Operator node runs: the toolkit's own copy of
nvct under its bundled Python, started by the ``nvidia-container-runtime``
(jit-cdi) or ``nvidia-container-runtime.cdi`` sh wrapper with the installed
config, the hooks being the toolkit's wrappers too. One toolkit per
low-level runtime (its config names one), installed once per session.

The installed config is the installer's, with two test settings: a debug log
(moved to ``tmp_path/nvct.log`` after each start, where
:func:`tests.support.gpu_runs.refusal` reads it) and, for cdi mode, the spec
dir holding the spec the toolkit's ``nvidia-ctk cdi generate`` wrote.
The same starts run nvct installed from the project's .deb
(:mod:`tests.support.deb_runs`), entered in its private root.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from .bundle import edit_config, make_bundle
from .gpu_runs import NVCT, PATH_ENV, mounts_under, run_gpu
from .proc import Result
from .runtimes import RUNTIMES, run_container

#: The modes a toolkit's wrappers are tested in: the default wrapper's (set at install) and ``.cdi``'s.
TOOLKIT_MODES = ("jit-cdi", "cdi")
#: How nvct got onto the node: the project's venv (a pip install), ``nvct toolkit install``, or the
#: project's .deb in a private root (:mod:`tests.support.deb_runs`, in the same modes).
INSTALLS = ("venv", "toolkit", "deb")
#: The session fixture that gives, per runtime, an install of each kind but the venv.
_FIXTURES = {"toolkit": "toolkits", "deb": "deb_nodes"}
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@dataclass
class Toolkit:
    """An installed toolkit: its directory (``toolkit``), debug log and cdi spec dir."""

    root: str
    log: str
    spec_dir: str

    def runtime(self, mode: str) -> str:
        """The runtime wrapper an engine is given for ``mode``."""
        if mode not in TOOLKIT_MODES:
            raise AssertionError(f"toolkit runs cover {TOOLKIT_MODES}, not {mode!r}")
        return os.path.join(self.root, "nvidia-container-runtime" + (".cdi" if mode == "cdi" else ""))

    def tool(self, name: str) -> str:
        return os.path.join(self.root, name)

    def enter(self, cwd: str = "/") -> list[str]:
        """Nothing: the toolkit is on this machine's root."""
        return []


def install(directory: str, node: Mapping, runtime: str) -> Toolkit:
    """``nvct toolkit install --no-daemon --no-runtime-config`` for ``node`` in ``directory``, jit-cdi by default."""
    roots = node["roots"]
    log = os.path.join(directory, "nvct.log")
    argv = [NVCT, "toolkit", "install", "--no-daemon", "--no-runtime-config",
            "--toolkit-install-dir", os.path.join(directory, "install"),
            "--pid-file", os.path.join(directory, "toolkit.pid"), "--host-root", "/",
            "--driver-root", roots["driver_root"], "--dev-root", roots["dev_root"],
            "--proc-root", roots["proc_root"], "--nvidia-container-runtime.mode", "jit-cdi",
            "--nvidia-container-runtime.runtimes", RUNTIMES[runtime][0],
            "--nvidia-container-runtime.debug", log]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_ENV, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    toolkit = Toolkit(os.path.join(directory, "install", "toolkit"), log, os.path.join(directory, "cdi"))
    _own_spec_dir(toolkit)
    return toolkit


def _own_spec_dir(toolkit: Toolkit) -> None:
    """The ``.cdi`` wrapper's spec dirs: a private one holding the toolkit's generated spec (not /etc/cdi)."""
    config = os.path.join(toolkit.root, ".config", "nvidia-container-runtime", "config.cdi.toml")
    with open(config) as f:
        text = f.read()
    default = 'spec-dirs = ["/etc/cdi", "/var/run/cdi"]\n'
    assert text.count(default) == 1, text
    with open(config, "w") as f:
        f.write(text.replace(default, f'spec-dirs = ["{toolkit.spec_dir}"]\n'))
    os.makedirs(toolkit.spec_dir)
    proc = subprocess.run([toolkit.tool("nvidia-ctk"), "cdi", "generate", "--output",
                           os.path.join(toolkit.spec_dir, "nvidia.yaml")],
                          capture_output=True, text=True, env=_ENV, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


def run_toolkit_gpu(toolkit: Toolkit, tmp_path, rootfs: str, *, mode: str, env: Sequence[str] = (),
                    command: str = "true", name: str = "bundle", timeout: float = 60,
                    edit: Callable[[dict], None] | None = None, wrapper: Sequence[str] = ()) -> Result:
    """:func:`tests.support.gpu_runs.run_gpu`'s start through ``toolkit``'s wrapper for ``mode``
    (or a :class:`tests.support.deb_runs.DebNode`'s runtime, in its private root)."""
    bundle = make_bundle(os.path.join(str(tmp_path), name), rootfs, ["sh", "-c", command], env=[PATH_ENV, *env])
    if edit is not None:
        with edit_config(bundle) as spec:
            edit(spec)
    try:
        return run_container([*toolkit.enter(bundle), *wrapper, toolkit.runtime(mode)], bundle, env=_ENV,
                             timeout=timeout,
                             log_file=os.path.join(str(tmp_path), f"{name}.log.json"))
    finally:
        if os.path.exists(toolkit.log):  # this start's lines, where refusal() looks
            with open(toolkit.log) as f, open(os.path.join(str(tmp_path), "nvct.log"), "a") as out:
                out.write(f.read())
            os.unlink(toolkit.log)


def installs(request, install: str) -> Callable[[str], Toolkit] | None:
    """runtime -> the install of kind ``install`` (its session fixture); None for the venv."""
    return request.getfixturevalue(_FIXTURES[install]) if install != "venv" else None


def starter(install: str, toolkits: Callable[[str], Toolkit] | None = None) -> Callable[..., Result]:
    """``run_gpu``, or the same call (node aside) through ``toolkits(runtime)``, a toolkit or a deb install."""
    if install == "venv":
        return run_gpu
    assert toolkits is not None

    def start(tmp_path, node: Mapping, rootfs: str, *, mode: str, runtime: str = "runc", **kwargs) -> Result:
        return run_toolkit_gpu(toolkits(runtime), tmp_path, rootfs, mode=mode, **kwargs)

    return start


def hook_program(install: str, toolkits: Callable[[str], Toolkit] | None = None, runtime: str = "runc") -> str:
    """The ``nvct`` a CDI spec's hook runs: the venv's, the toolkit's wrapper, or the deb's program."""
    return NVCT if install == "venv" else toolkits(runtime).tool("nvct")


def enter(install: str, toolkits: Callable[[str], Toolkit] | None = None, runtime: str = "runc",
          cwd: str = "/") -> list[str]:
    """The argv prefix a runtime of ``install`` runs under: nothing, or the deb's private root."""
    return [] if install == "venv" else toolkits(runtime).enter(cwd)


def mounts_left(path: str, install: str, toolkits: Callable[[str], Toolkit] | None = None,
                runtime: str = "runc") -> list[str]:
    """Mount points at or below ``path`` where ``install``'s runtime ran (none may be left after a run)."""
    if install == "deb":
        return toolkits(runtime).mounts_under(path)
    return mounts_under(path)
