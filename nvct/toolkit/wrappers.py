"""The installed executables: small sh scripts that run the toolkit's own Python on the copied nvct.

Each sets ``NVIDIA_CTK_CONFIG_FILE_PATH`` to the installed config and puts the
toolkit directory first on ``PATH``, sets every variable aside as the sh fronts do
(the marked lines of ``nvct/scripts/nvidia-container-runtime``; :mod:`nvct.oci.environ`
takes back what the program needs), then execs the bundled interpreter through its
own loader (:func:`nvct.toolkit.python.command`; or a host python3 given by
``--python``) with ``-I`` on :mod:`nvct.toolkit.entry`. The runtime wrappers
first check that the NVIDIA kernel module is loaded -- ``driver/nvidia/version``
under the proc root (``$NVCT_PROC_ROOT``, else the installed one), or, for
the real ``/proc``, ``/sys/module/nvidia`` -- and until it is, exec the
low-level runtime directly, so a node whose driver is not up yet still runs
containers (as the reference's wrappers do; they read ``/proc/modules``,
which not every kernel has). After that, they carry the sh front's
passthrough (the marked lines of ``nvct/scripts/nvidia-container-runtime``):
every call but create/run, and the create/run of a spec that surely asks for
no GPU, goes to the low-level runtime the shim recorded for the installed
config, without a Python start, exactly as the deb's front does. Where the GPU Operator makes ``nvidia`` the default runtime,
that is every start, state, kill and delete of every pod on the node.
"""

from __future__ import annotations

import os
import shlex
from typing import Sequence, Union

from nvct.base.errors import NvctError
from nvct.toolkit.layout import Layout

#: The lines of the sh front that :func:`passthrough` copies start and end with these.
_PASSTHROUGH = ("# --- passthrough:", "# --- end of passthrough ---\n")
#: ... and those that :func:`set_aside` copies.
_SET_ASIDE = ("# --- set aside:", "# --- end of set aside ---\n")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The interpreter: a path, or the argv that starts it (the bundled one: loader, --library-path, python).
Python = Union[str, Sequence[str]]


def runtime_wrapper(layout: Layout, suffix: str, mode: str | None, *, python: Python, fallback: str,
                    proc_root: str = "/proc") -> str:
    """``nvidia-container-runtime[.suffix]``: the shim with its config, or ``fallback`` without a driver."""
    name = _name(layout.runtime(suffix), layout)
    return "".join([
        _header(name, f"mode {mode!r}" if mode else "the configured mode"),
        "# Until the NVIDIA kernel module is loaded, containers run on the low-level runtime alone.\n",
        f"proc_root=${{NVCT_PROC_ROOT:-{_q(proc_root or '/proc')}}}\n",
        'if [ ! -e "$proc_root/driver/nvidia/version" ] && '
        '{ [ "$proc_root" != /proc ] || [ ! -d /sys/module/nvidia ]; }; then\n',
        f'    echo "{name}: the NVIDIA kernel module is not loaded ($proc_root/driver/nvidia/version '
        f'is missing): running {_escape_dq(fallback)} directly" >&2\n',
        f'    exec {_q(fallback)} "$@"\n',
        "fi\n",
        _config(layout.config(mode)),
        passthrough(),
        _exec(layout, "nvidia-container-runtime", layout.runtime(suffix), python),
    ])


def tool_wrapper(layout: Layout, program: str, *, python: Python) -> str:
    """One of :data:`nvct.toolkit.layout.TOOLS` (``program``), with the installed config."""
    path = layout.tool(program)
    return _header(_name(path, layout), None) + _config(layout.config()) + _exec(layout, program, path, python)


def _header(name: str, mode: str | None) -> str:
    what = f" ({mode})" if mode else ""
    return (f"#!/bin/sh\n# {name}{what}: written by `nvct toolkit install`, removed when it stops.\n"
            "# Runs nvct with the toolkit's own Python (see docs/installer.md).\n")


def passthrough() -> str:
    """The sh front's lines that exec every call but a GPU create/run on the cached low-level runtime."""
    return _front_lines(_PASSTHROUGH, "passthrough")


def set_aside() -> str:
    """The sh front's lines that set every variable aside before the interpreter starts."""
    return _front_lines(_SET_ASIDE, "set aside")


def _front_lines(marks: tuple[str, str], what: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "nvidia-container-runtime")) as f:
        text = f.read()
    start, end = text.find(marks[0]), text.find(marks[1])
    if start < 0 or end < start:
        raise NvctError(f"{f.name}: the {what} marks are missing (a broken nvct install?)")
    return text[start:end + len(marks[1])]


def _config(config: str) -> str:
    return f"export NVIDIA_CTK_CONFIG_FILE_PATH={_q(config)}\n"


def _exec(layout: Layout, program: str, self_path: str, python: Python) -> str:
    return (f'export PATH={_q(layout.root)}:"${{PATH:-{DEFAULT_PATH}}}"\n'
            + set_aside() +
            f'exec {interpreter(python)} -I {_q(layout.entry)} {program} {_q(self_path)} "$@"\n')


def interpreter(python: Python) -> str:
    """``python`` as a quoted sh command prefix."""
    return _q(python) if isinstance(python, str) else " ".join(_q(a) for a in python)


def _name(path: str, layout: Layout) -> str:
    return path[len(layout.root) + 1:]


def _q(value: str) -> str:
    return shlex.quote(value)


def _escape_dq(value: str) -> str:
    """``value`` inside a double-quoted sh string."""
    return "".join("\\" + c if c in '"$`\\' else c for c in value)
