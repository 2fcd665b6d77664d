"""Who can change what runs as root: every file on nvct's chain must be writable by root alone.

A GPU container start runs, as root, the programs engines name (the runtime,
the hook, ``nvct``), the interpreter they start, nvct's Python package and its
dependencies, a toolkit tree's bundled Python and libraries, the low-level
runtime, and reads nvct's config. Any of these, or a directory above one, that
a non-root user owns or may write lets that user run code as root at the next
GPU container start (a line prepended to the bundled Python's ``._pth``, a
swapped ``libz.so.1``, a ``.pyc`` dropped in a writable ``__pycache__``).

:func:`weakness` is the one rule; ``nvct toolkit install`` checks its finished
tree with it before switching it in (:mod:`nvct.toolkit.install`).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

from nvct.base.errors import NvctError
from nvct.config.file import parse_toml
from nvct.doctor.model import Context, fail, ok
from nvct.linux.ownership import ancestors, walk, weakness
from nvct.oci import runtime as lowlevel
from nvct.toolkit import entry
from nvct.toolkit.layout import RUNTIMES_DIR

ID = "permissions.chain"
#: The programs engines and hooks run by name (the package's, pip's, a toolkit's wrappers).
PROGRAMS = ("nvidia-container-runtime", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy",
            "nvidia-container-runtime-hook", "nvct", "nvidia-cdi-hook", "nvidia-ctk", "nvidia-container-cli")
#: Python packages the programs import besides the standard library (the toolkit's one list).
PACKAGES = ("nvct", *entry.DEPENDENCIES)
#: Where ``nvct toolkit install`` puts its tree by default (the GPU Operator's).
DEFAULT_TOOLKITS = ("/usr/local/nvidia/toolkit",)
_SHOWN = 8


def check_chain(ctx: Context):
    trees, files = chain(ctx)
    problems: dict[str, str] = {}
    count = 0
    for root in sorted(trees):
        for path in walk(root):
            count += 1
            _note(problems, path)
    for path in sorted(files - trees):
        count += 1
        _note(problems, path)
    dirs = {d for p in trees | files for d in ancestors(p)} - trees - files
    for directory in sorted(dirs):
        count += 1
        _note(problems, directory, above=True)
    if not problems:
        yield ok(ID, f"{count} files and directories that run as root at a container start (programs, their "
                 f"interpreters, nvct's Python packages, {len(trees)} package or toolkit trees, the config, and "
                 f"the directories above them) are root-owned and writable by root alone")
        return
    shown = sorted(problems)[:_SHOWN]
    more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
    seen = "; ".join(f"{p} ({problems[p]})" for p in shown)
    yield fail(ID, f"a non-root user can change what runs as root at the next GPU container start: {seen}{more}",
               _fix(problems, trees))


def chain(ctx: Context) -> tuple[set[str], set[str]]:
    """The trees walked whole (packages, toolkit trees) and the single files of the chain."""
    path_env = ctx.options.default_path
    trees: set[str] = set()
    files: set[str] = set()
    here = os.path.dirname(os.path.abspath(sys.argv[0] or "")) if sys.argv else ""  # a pip or toolkit bin dir
    programs = {p for p in (shutil.which(name, path=f"{path_env}:{here}") for name in PROGRAMS) if p}
    programs |= {p for p in (os.path.join(here, name) for name in PROGRAMS) if here and os.path.isfile(p)}
    programs |= set(_engine_programs(ctx))
    if ctx.config is not None:
        programs |= {p for p in _config_programs(ctx) if p}
    for toolkit in DEFAULT_TOOLKITS:
        if os.path.isdir(os.path.join(toolkit, RUNTIMES_DIR)):
            trees.add(toolkit)
    for program in sorted(programs):
        files |= _with_target(program)
        toolkit = os.path.dirname(program)
        if os.path.isdir(os.path.join(toolkit, RUNTIMES_DIR)):
            trees.add(toolkit)
        for used in _runs(program):
            files |= _with_target(used)
    sources = [([_module_path(name) for name in PACKAGES], sys.path)]  # what this nvct runs on
    pythons = {os.path.abspath(sys.executable)}  # by path: a virtualenv's links to the same binary
    for path in sorted(files):  # and what each other interpreter the programs start would import
        if _is_python(path) and os.path.abspath(path) not in pythons:
            pythons.add(os.path.abspath(path))
            sources.append(_imports_of(path))
    for located, search in sources:
        for found in located:
            if found:
                (trees if os.path.isdir(found) else files).add(found)
        files |= {d for d in search if d and os.path.isdir(d)}
    files |= _with_target(sys.executable)
    files.add(ctx.config_file)
    for path in list(files):  # the toolkit tree a wrapper, the doctor itself or the config runs from
        root, sep, _ = path.partition(f"/{RUNTIMES_DIR}/")
        if not sep:
            root, sep, _ = path.partition("/.config/nvidia-container-runtime/")
        if sep and os.path.isdir(os.path.join(root, RUNTIMES_DIR)):
            trees.add(root)
    return trees, {f for f in files if os.path.lexists(f)}


def _note(problems: dict, path: str, above: bool = False) -> None:
    try:
        why = weakness(os.lstat(path), above=above)
    except OSError:
        return
    if why:
        problems[path] = why


def _fix(problems: dict, trees: set) -> str:
    """chown/chmod commands: a whole tree at once (``-R``) where the problem is inside one."""
    def target(path: str) -> str:
        return next((t for t in sorted(trees) if path == t or path.startswith(t + "/")), path)

    owned = sorted({target(p) for p, why in problems.items() if why.startswith("owned")})
    loose = sorted({target(p) for p, why in problems.items() if not why.startswith("not a file")})
    other = sorted(p for p, why in problems.items() if why.startswith("not a file"))

    def cmd(words: str, paths: list) -> str:
        recursive = "-R " if any(p in trees for p in paths) else ""
        return f"{words.replace(' ', ' ' + recursive, 1)} " + " ".join(shlex.quote(p) for p in paths[:_SHOWN])

    steps = ([cmd("chown root:root", owned)] if owned else []) + ([cmd("chmod go-w", loose)] if loose else [])
    if other:
        steps.append("remove " + " ".join(shlex.quote(p) for p in other[:_SHOWN]))
    fix = " && ".join(steps)
    if max(len(owned), len(loose), len(other)) > _SHOWN:
        fix += " (and the same for the rest: nvct doctor --json lists them)"
    return fix + "; then find out who changed them"


def _with_target(path: str) -> set[str]:
    """``path`` and, for a link, what it resolves to."""
    out = {os.path.abspath(path)}
    real = os.path.realpath(path)
    if os.path.exists(real):
        out.add(real)
    return out


def _runs(program: str) -> list[str]:
    """What a program starts: its ``#!`` interpreter, and in an sh front or wrapper, the absolute
    paths it assigns to ``python=`` or execs (the toolkit's loader, interpreter, entry, fallback)."""
    try:
        with open(program, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    text = head.decode("utf-8", "replace")
    lines = text.splitlines()
    out = lines[0][2:].split()[:1]
    for line in lines[1:]:
        line = line.strip()
        if line.startswith(("exec ", "python=")):
            try:
                words = shlex.split(line.replace("python=", "python= ", 1), comments=True)
            except ValueError:
                continue
            out += [w for w in words if w.startswith("/") and os.path.isfile(w)]
    venv_python = os.path.join(os.path.dirname(program), "python3")
    if "python=" in text and os.path.isfile(venv_python):  # nvct's sh fronts prefer a virtualenv's
        out.append(venv_python)
    return [p for p in out if os.path.isabs(p)]


def _is_python(path: str) -> bool:
    """A host interpreter a program starts (a toolkit's bundled one is walked with its tree)."""
    return os.path.basename(path).startswith("python") and f"/{RUNTIMES_DIR}/" not in path and \
        os.path.isfile(path) and os.access(path, os.X_OK)


_ASK = ("import importlib.util as u, json, sys\n"
        "def at(n):\n"
        "    try: s = u.find_spec(n)\n"
        "    except Exception: return None\n"
        "    if s is None: return None\n"
        "    return list(s.submodule_search_locations)[0] if s.submodule_search_locations else s.origin\n"
        "print(json.dumps([[at(n) for n in sys.argv[1:]], sys.path]))\n")


def _imports_of(python: str) -> tuple[list, list]:
    """Where ``python -I`` (as the programs start it) finds nvct and its dependencies, and its sys.path."""
    try:
        out = subprocess.run([python, "-I", "-c", _ASK, *PACKAGES], capture_output=True, timeout=10,
                             stdin=subprocess.DEVNULL, cwd="/", env={"PATH": "/usr/bin:/bin"}, check=False).stdout
        located, search = json.loads(out)
        return [p for p in located if isinstance(p, str) and os.path.isabs(p)], \
            [p for p in search if isinstance(p, str) and os.path.isabs(p)]
    except (OSError, subprocess.SubprocessError, ValueError, TypeError):
        return [], []


def _module_path(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return spec.origin if spec.origin and os.path.isabs(spec.origin) else None


def _config_programs(ctx: Context) -> list[str]:
    """The hook programs and the low-level runtime nvct's config names."""
    out = []
    for value in (ctx.config.nvct_path, ctx.config.ctk_path, ctx.config.hook_path):
        if isinstance(value, str) and os.path.isabs(value):
            out.append(value)
    try:
        out.append(lowlevel.find(ctx.config.runtimes))
    except Exception:  # noqa: BLE001 - config.runtimes reports it
        pass
    return [p for p in out if os.path.exists(p)]


def _engine_programs(ctx: Context) -> list[str]:
    """Runtime binaries the engines' configs name (docker, containerd, cri-o): nvct's or any other."""
    out = []
    try:
        with open(ctx.options.docker_config, "rb") as f:
            data = json.loads(f.read() or b"{}")
        for entry in (data.get("runtimes") or {}).values():
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                out.append(entry["path"])
    except (OSError, ValueError, AttributeError):
        pass
    crio = ctx.options.crio_dir
    for path in [ctx.options.containerd_config] + sorted(glob.glob("/etc/containerd/conf.d/*.toml")) + \
            [os.path.join(os.path.dirname(crio), "crio.conf")] + sorted(glob.glob(os.path.join(crio, "*"))):
        out += _toml_binaries(path)
    resolved = []
    for binary in out:
        if not os.path.isabs(binary):
            binary = shutil.which(binary, path=ctx.options.default_path) or ""
        if binary and os.path.exists(binary):
            resolved.append(binary)
    return resolved


def _toml_binaries(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = parse_toml(f.read(), path)
    except (OSError, NvctError):
        return []
    out = []

    def visit(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("BinaryName", "runtime_path") and isinstance(value, str) and value:
                    out.append(value)
                else:
                    visit(value)

    visit(data)
    return out


CHECKS = (check_chain,)
