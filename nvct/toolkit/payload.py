"""The Python code the installed wrappers run: a copy of this nvct and its dependencies.

The host runs it with its own ``python3`` (3.9 or newer). nvct and its
pure-Python dependencies are copied from wherever the installer imports them
(the installer's image), so the host needs nothing else. python-prctl is a
C extension: the copy loads only on a host Python of the image's version;
on others :mod:`nvct.linux.privileges` makes the same calls through libc.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from nvct.base.errors import NvctError
from nvct.toolkit import entry

#: Copied beside nvct: every module of the one dependency list, needed on this host's Python or not.
DEPENDENCIES = tuple(entry.DEPENDENCIES)
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


def copy_python(dest: str, modules: tuple = ("nvct",) + DEPENDENCIES) -> list[str]:
    """Copy each of ``modules`` (package dir or single file) into ``dest``; the names copied."""
    os.makedirs(dest, mode=0o755, exist_ok=True)
    copied = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or (spec.origin is None and not spec.submodule_search_locations):
            raise NvctError(f"cannot copy the Python module {name!r} to the host: the installer "
                            f"cannot import it itself")
        try:
            if spec.submodule_search_locations:
                source = list(spec.submodule_search_locations)[0]
                shutil.copytree(source, os.path.join(dest, name), ignore=_SKIP, symlinks=False)
            else:
                assert spec.origin is not None  # checked above
                shutil.copy2(spec.origin, os.path.join(dest, os.path.basename(spec.origin)))
        except OSError as e:
            raise NvctError(f"{dest}: cannot copy the Python module {name!r}: {e}") from None
        copied.append(name)
    return copied
