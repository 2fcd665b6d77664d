"""The hook programs' check of their own environment: defence in depth behind the seal.

Every hook nvct writes carries a fixed ``env`` (:data:`nvct.edits.HOOK_ENV`), so no
container variable reaches a hook. If a variable that takes a process over (the
dynamic loader's, Python's) is there anyway, the seal has failed somewhere: ld.so
acted on it before the interpreter's first instruction, and ``-I`` only keeps Python
from reading PYTHON*. Going on would hide that, so the hook stops with one line
before it touches the container. It also leaves its working directory (a container's
rootfs under runc) for ``/``: nothing it does may resolve a relative path there.

The runtime's own environment is not a container's: prestart hooks run with it
(``docker --gpus`` gives the legacy hook dockerd's environment, to which containerd's
shim adds ``LD_LIBRARY_PATH=/opt/containerd/lib:``). Those programs accept an
``LD_LIBRARY_PATH`` of absolute directories (an empty entry is the working directory,
the runtime's bundle for a prestart hook) and drop it for everything they run.
See docs/security.md.
"""

from __future__ import annotations

import os
import sys

_LOADER = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH")
#: Hook programs that run as prestart hooks, in the runtime's namespaces and environment.
_PRESTART = ("nvidia-container-runtime-hook", "nvidia-container-cli")


def is_hook(program: str, argv: list[str]) -> bool:
    """Whether this start of ``program`` runs as a container's hook."""
    if program in ("nvct", "nvidia-ctk"):
        return argv[1:2] == ["hook"]
    if program == "nvidia-container-cli":
        return "configure" in argv[1:]
    return program in ("nvidia-container-runtime-hook", "nvidia-cdi-hook")


def unsealed(program: str, environ=os.environ) -> str | None:
    """The first variable that must not be in this hook's environment, or None."""
    for name in sorted(environ):
        if name.startswith("PYTHON") or name in ("LD_PRELOAD", "LD_AUDIT"):
            return name
        if name == "LD_LIBRARY_PATH" and not (program in _PRESTART and _runtime_dirs(environ[name])):
            return name
    return None


def _runtime_dirs(value: str) -> bool:
    return all(not d or (d.startswith("/") and not d.startswith("/proc/") and "/../" not in d + "/")
               for d in value.split(":"))


def check(program: str, argv: list[str] | None = None, own_lib_dir: str | None = None) -> None:
    """Exit 1 with one line if this hook's environment is not sealed; else go on from ``/``.

    ``own_lib_dir``: the toolkit directory's ``lib``, which its wrapper puts first in
    ``LD_LIBRARY_PATH`` itself; what follows it is judged as the caller's.
    """
    argv = sys.argv if argv is None else argv
    if not is_hook(program, argv):
        return
    environ = dict(os.environ)
    if own_lib_dir and environ.get("LD_LIBRARY_PATH", "").split(":")[0] == own_lib_dir:
        rest = environ.pop("LD_LIBRARY_PATH")[len(own_lib_dir) + 1:]
        if rest:
            environ["LD_LIBRARY_PATH"] = rest
    name = unsealed(program, environ)
    if name:
        sys.stderr.write(f"{program}: refusing to run: {name} is set in the hook's environment; "
                         "a hook's env must be the fixed one nvct writes (see docs/security.md)\n")
        sys.exit(1)
    os.environ.pop("LD_LIBRARY_PATH", None)
    os.chdir("/")
