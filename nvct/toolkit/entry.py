"""What the installed wrappers run: ``python3 -I <this file> PROGRAM WRAPPER [ARGS...]``.

``-I`` keeps the environment (PYTHONPATH, user site-packages, the current
directory) out of the import path; this file puts the copy of nvct it lives
in (and the dependencies beside it) first. ``WRAPPER`` becomes ``argv[0]``,
so nvct sees the wrapper's path as its own: the shim never picks itself as
the low-level runtime. ``PROGRAM WRAPPER --check`` is the installer's test
that the host's Python can run nvct at all; it also compiles the copy for
that Python, so no container start pays for it.
"""

import os
import sys

#: The one dependency list: each module copied beside nvct (nvct.toolkit.payload), and whether the
#: host's Python must import it (:func:`check`). tomllib is standard from 3.11; tomlkit serves older
#: Pythons (and ``nvct config`` edits). python-prctl is optional: where its C extension (``_prctl``)
#: does not load, nvct.linux.privileges makes the calls through libc.
DEPENDENCIES = {
    "click": True,
    "tomlkit": sys.version_info < (3, 11),
    "yaml": True,
    "prctl": False,
    "_prctl": False,
}
#: What container starts import: a Python too old for their syntax fails here, not in a container start.
NVCT_MODULES = ("nvct.programs.shim", "nvct.programs.hook", "nvct.hooks", "nvct.cli", "nvct.modifier.modes",
                "nvct.edits.build", "nvct.modifier.legacy", "nvct.rootfs.ldconfig", "nvct.cdi.modes",
                "nvct.programs.cdi_hook", "nvct.programs.ctk", "nvct.programs.container_cli")
MINIMUM_PYTHON = (3, 9)


def python_dir() -> str:
    """``lib/python``: three levels up from ``nvct/toolkit/entry.py``."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.dirname(os.path.dirname(here))


def required() -> tuple:
    """The dependencies this Python must import to run nvct."""
    return tuple(name for name, needed in DEPENDENCIES.items() if needed)


def check() -> int:
    """Import everything nvct needs; say what is missing. Exit status 0 only if all is there."""
    missing = []
    if sys.version_info < MINIMUM_PYTHON:
        missing.append("Python >= %d.%d (this is %s)" % (MINIMUM_PYTHON + (sys.version.split()[0],)))
    wanted = required() + NVCT_MODULES
    for name in wanted:
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 - an extension built for another Python raises more than ImportError
            missing.append("%s (%s: %s)" % (name, type(e).__name__, e))
    if missing:
        sys.stderr.write("missing: %s\n" % "; ".join(missing))
        return 1
    import compileall

    compileall.compile_dir(python_dir(), quiet=1)
    sys.stdout.write("ok: Python %s at %s\n" % (sys.version.split()[0], sys.executable))
    return 0


def main() -> int:
    sys.path.insert(0, python_dir())
    if sys.argv[3:] == ["--check"]:
        sys.argv = sys.argv[2:]
        return check()
    from nvct.oci.environ import PROGRAMS, start  # the one table (nvct/scripts/launcher reads it too)

    if len(sys.argv) < 3 or sys.argv[1] not in PROGRAMS:
        sys.stderr.write("usage: python3 -I %s {%s} WRAPPER [ARGS...]\n" % (sys.argv[0], ",".join(PROGRAMS)))
        return 2
    program = sys.argv[1]
    sys.argv = sys.argv[2:]
    start(program)  # the wrapper set the environment aside (nvct.toolkit.wrappers)
    module = __import__(PROGRAMS[program], fromlist=["main"])
    return module.main()


if __name__ == "__main__":
    sys.exit(main())
