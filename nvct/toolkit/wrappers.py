"""The installed executables: nvct/scripts/launcher, run on the toolkit's own Python and copy of nvct.

Each wrapper is the launcher that pip and the packages install (the one
template), with its two ``@`` lines filled in and nothing else changed: the
prelude sets ``NVIDIA_CTK_CONFIG_FILE_PATH`` to the installed config and puts
the toolkit directory first on ``PATH``; the interpreter's start execs the
bundled interpreter through its own loader (:func:`nvct.toolkit.python.command`;
or a host python3 given by ``--python``) with ``-I`` on :mod:`nvct.toolkit.entry`.
Between the two, the launcher's sh front does what it does everywhere: the
runtime's passthrough (every call but create/run, and the create/run of a spec
that surely asks for no GPU, goes to the low-level runtime the shim recorded for
the installed config, without a Python start; where the GPU Operator makes
``nvidia`` the default runtime, that is every start, state, kill and delete of
every pod on the node), the hook's exit without a GPU request, and the setting
aside of every variable (:mod:`nvct.oci.environ` takes back what the program needs).

The runtime wrappers' prelude first checks that the NVIDIA kernel module is
loaded -- ``driver/nvidia/version`` under the proc root (``$NVCT_PROC_ROOT``,
else the installed one), or, for the real ``/proc``, ``/sys/module/nvidia`` --
and until it is, execs the low-level runtime directly, so a node whose driver is
not up yet still runs containers (as the reference's wrappers do; they read
``/proc/modules``, which not every kernel has).
"""

from __future__ import annotations

import os
import shlex
from typing import Sequence, Union

from nvct.base.errors import NvctError
from nvct.toolkit.layout import Layout

#: The launcher's lines a wrapper fills in: each must be there exactly once.
_PYTHON_LINE = '    exec "$python" -I -S "$0" "$@"  # @python@\n'
_PRELUDE_LINE = "# @prelude@\n"
#: The last line of the launcher's sh half.
_SH_END = "\nexit 127\n"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The interpreter: a path, or the argv that starts it (the bundled one: loader, --library-path, python).
Python = Union[str, Sequence[str]]


def runtime_wrapper(layout: Layout, suffix: str, mode: str | None, *, python: Python, fallback: str,
                    proc_root: str = "/proc") -> str:
    """``nvidia-container-runtime[.suffix]``: the shim with its config, or ``fallback`` without a driver."""
    path = layout.runtime(suffix)
    name = _name(path, layout)
    return _launcher(name, f"mode {mode!r}" if mode else "the configured mode", "".join([
        "# Until the NVIDIA kernel module is loaded, containers run on the low-level runtime alone.\n",
        f"proc_root=${{NVCT_PROC_ROOT:-{_q(proc_root or '/proc')}}}\n",
        'if [ ! -e "$proc_root/driver/nvidia/version" ] && '
        '{ [ "$proc_root" != /proc ] || [ ! -d /sys/module/nvidia ]; }; then\n',
        f'    echo "{name}: the NVIDIA kernel module is not loaded ($proc_root/driver/nvidia/version '
        f'is missing): running {_escape_dq(fallback)} directly" >&2\n',
        f'    exec {_q(fallback)} "$@"\n',
        "fi\n",
        _prelude(layout, layout.config(mode)),
    ]), _start(layout, "nvidia-container-runtime", path, python))


def tool_wrapper(layout: Layout, program: str, *, python: Python) -> str:
    """One of :data:`nvct.toolkit.layout.TOOLS` (``program``), with the installed config."""
    path = layout.tool(program)
    start = _start(layout, program, path, python)
    return _launcher(_name(path, layout), None, _prelude(layout, layout.config()), start)


def _launcher(name: str, mode: str | None, prelude: str, start: str) -> str:
    """nvct/scripts/launcher with its @ lines filled in, under a header naming the wrapper."""
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "launcher")
    with open(path) as f:
        text = f.read()
    for line in (_PYTHON_LINE, _PRELUDE_LINE, _SH_END):
        if text.count(line) != 1:
            raise NvctError(f"{path}: not one line {line.strip()!r} (a broken nvct install?)")
    what = f" ({mode})" if mode else ""
    header = (f"# {name}{what}: written by `nvct toolkit install`, removed when it stops.\n"
              "# Runs nvct with the toolkit's own Python (see docs/installer.md).\n")
    shebang, _, rest = text.partition("\n")
    rest = rest[:rest.index(_SH_END) + len(_SH_END)]  # the Python half: the wrapper never gets there
    return shebang + "\n" + header + rest.replace(_PYTHON_LINE, start).replace(_PRELUDE_LINE, prelude)


def _prelude(layout: Layout, config: str) -> str:
    return (f"export NVIDIA_CTK_CONFIG_FILE_PATH={_q(config)}\n"
            f'export PATH={_q(layout.root)}:"${{PATH:-{DEFAULT_PATH}}}"\n')


def _start(layout: Layout, program: str, self_path: str, python: Python) -> str:
    return f'    exec {interpreter(python)} -I {_q(layout.entry)} {program} {_q(self_path)} "$@"\n'


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
