"""The Python runtime the toolkit directory carries: the installer's own CPython, made relocatable.

The node may have no python3 at all (Flatcar, Talos, CoreOS) or one too old
(RHEL 8, Amazon Linux 2). So ``nvct toolkit install`` copies the interpreter
it runs on (the image's), the part of its standard library nvct can use,
and every shared library those need -- down to the ELF loader and libc --
into one versioned directory::

    .runtime/<version>/
      bin/python3.X          the image's interpreter, unchanged
      bin/python3.X._pth     pins sys.path (below)
      lib/ld-linux-*.so.*    the image's loader; the wrappers exec it with
      lib/libc.so.6 ...        ``--library-path <version>/lib``
      lib/python3.X/         standard library (+ lib-dynload)
      lib/python/            nvct and its dependencies

Nothing of the host is read but the kernel: the loader comes from the
bundle, ``--library-path`` replaces ``LD_LIBRARY_PATH`` and the host's
``ld.so.cache`` for the interpreter's own libraries, and the ``._pth`` file
makes CPython (3.11+ on every platform) take sys.path from it alone,
relative to the bundle, with isolated mode and no ``site``: ``PYTHONHOME``
and ``PYTHONPATH`` of any environment are ignored and no compiled-in
``/usr/lib/python3...`` is ever searched.
"""

from __future__ import annotations

import os
import shutil
import sys

from nvct.base.errors import NvctError
from nvct.discover import ldcache
from nvct.linux import elf

#: Standard-library parts nvct never imports and a node never needs (tests, GUIs, build tools).
STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "turtle.py", "ensurepip", "lib2to3", "pydoc_data",
               "distutils", "venv", "sqlite3", "dbm", "curses", "site-packages", "dist-packages",
               "EXTERNALLY-MANAGED", "__phello__", "unittest", "idle*", "config-3*")
#: Extension modules left out: test modules, and those that would bring large libraries (ssl: libcrypto).
DYNLOAD_SKIP = ("_test*", "_xx*", "xxlimited*", "_ctypes_test*", "_tkinter*", "_sqlite3*", "_curses*", "_dbm*",
                "_gdbm*", "readline*", "nis*", "ossaudiodev*", "audioop*", "_ssl*", "_hashlib*", "_crypt*")
#: Where the image's libraries are looked for when its ld.so.cache does not name them.
_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
             "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
_PYC_SKIP = ("*.opt-1.pyc", "*.opt-2.pyc")
MINIMUM = (3, 11)  # ._pth files are read on Linux from 3.11


def python_name() -> str:
    return "python%d.%d" % sys.version_info[:2]


def interpreter_path(root: str) -> str:
    """The interpreter inside a runtime directory ``root``."""
    return os.path.join(root, "bin", python_name())


def loader_path(root: str) -> str:
    """The ELF loader inside ``root`` (named as the image's)."""
    return os.path.join(root, "lib", os.path.basename(loader_of()))


def command(root: str) -> list[str]:
    """The argv prefix that starts the bundled interpreter: its own loader, its own libraries."""
    return [loader_path(root), "--library-path", os.path.join(root, "lib"), interpreter_path(root)]


def bundle(root: str, python_dirs: tuple[str, ...] = ("lib/python",)) -> None:
    """Put the installer's interpreter, standard library and libraries in ``root``; sys.path is
    the standard library plus ``python_dirs`` (relative to ``root``)."""
    if sys.version_info < MINIMUM:
        raise NvctError(f"the installer's Python {sys.version.split()[0]} cannot be bundled "
                        f"(it needs {MINIMUM[0]}.{MINIMUM[1]}+ for a ._pth file); run the installer's image, "
                        f"or give --python with the host's python3")
    lib = os.path.join(root, "lib")
    stdlib_dest = os.path.join(lib, python_name())
    os.makedirs(os.path.join(root, "bin"), mode=0o755, exist_ok=True)
    try:
        shutil.copy2(os.path.realpath(sys.executable), interpreter_path(root))
        stdlib = os.path.dirname(os.__file__)  # the base interpreter's, also from a virtualenv
        shutil.copytree(stdlib, stdlib_dest, symlinks=False,
                        ignore=_ignore_top(stdlib, STDLIB_SKIP + ("lib-dynload",), _PYC_SKIP))
        dynload = os.path.join(stdlib, "lib-dynload")
        shutil.copytree(dynload, os.path.join(stdlib_dest, "lib-dynload"), symlinks=False,
                        ignore=shutil.ignore_patterns(*DYNLOAD_SKIP))
        shutil.copy2(loader_of(), loader_path(root))
    except OSError as e:
        raise NvctError(f"{root}: cannot bundle the Python runtime: {e}") from None
    entries = [f"../lib/{python_name()}", f"../lib/{python_name()}/lib-dynload"]
    entries += [os.path.join("..", d) for d in python_dirs]
    with open(interpreter_path(root) + "._pth", "w", encoding="utf-8") as f:
        f.write("\n".join(entries) + "\n")


def copy_libraries(root: str, lib: str | None = None, elf_files: list[str] | None = None) -> list[str]:
    """Copy every shared library the ELF files under ``root`` (or ``elf_files``) need, transitively,
    from the image into ``lib`` (default ``root/lib``); the names copied."""
    lib = lib or os.path.join(root, "lib")
    cache = _cache()
    have = {name for name in os.listdir(lib) if ".so" in name}
    todo = list(_elf_files(root) if elf_files is None else elf_files)
    copied = []
    while todo:
        path = todo.pop()
        for needed in elf.read(path).needed:
            if needed in have or needed.startswith("ld-linux"):
                continue
            source = cache.get(needed) or _find(needed)
            if source is None:
                raise NvctError(f"{path}: needs {needed}, which the installer's image lacks")
            dest = os.path.join(lib, needed)
            shutil.copy2(os.path.realpath(source), dest)
            have.add(needed)
            copied.append(needed)
            todo.append(dest)
    return copied


def _elf_files(root: str):
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if (".so" in name or directory.endswith("/bin")) and not os.path.islink(path):
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        yield path


def loader_of(program: str | None = None) -> str:
    """The image's ELF loader: the PT_INTERP of ``program`` (default: its Python)."""
    loader = elf.interpreter(os.path.realpath(program or sys.executable))
    if loader is not None:
        return os.path.realpath(loader)
    raise NvctError(f"{program or sys.executable}: has no ELF loader (a static Python cannot be bundled this way)")


def _cache() -> dict[str, str]:
    try:
        entries = ldcache.load("/etc/ld.so.cache")
    except (OSError, NvctError):
        return {}
    out: dict[str, str] = {}
    for entry in entries:
        if entry.arch == _arch():
            out.setdefault(entry.key, entry.value)
    return out


def _arch() -> str:
    return {"x86_64": "x86_64", "aarch64": "aarch64"}.get(os.uname().machine, os.uname().machine)


def _find(soname: str) -> str | None:
    for directory in _LIB_DIRS:
        path = os.path.join(directory, soname)
        if os.path.exists(path):
            return path
    return None


def _ignore_top(top: str, names: tuple[str, ...], everywhere: tuple[str, ...]):
    top_ignore = shutil.ignore_patterns(*names)
    all_ignore = shutil.ignore_patterns(*everywhere)

    def ignore(directory: str, entries: list[str]) -> set[str]:
        skipped = set(all_ignore(directory, entries))
        if os.path.samefile(directory, top):
            skipped |= set(top_ignore(directory, entries))
        return skipped

    return ignore
