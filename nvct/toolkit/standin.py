"""What a removed toolkit leaves for containers it started: stand-ins at the runtime paths.

An engine records, per container, the runtime binary it was created with:
containerd's runc shim (docker's too) keeps it in the bundle's
``options.json`` (``binary_name``) and calls it again to kill, delete and ask
the state of the container; CRI-O's conmon has it on its command line. Once
the toolkit directory is gone, those calls fail (``fork/exec ...: no such
file or directory``) and the container can be neither stopped nor deleted.

So when the toolkit is removed while any process names one of its runtime
wrappers, each of those wrappers is replaced by a stand-in: a few lines of
sh, no Python and nothing else of the toolkit, that pass every call but
``create``/``run`` to the first low-level runtime of the installed config (the
one the shim itself would have picked), and refuse to create with one line.
Everything else in the directory goes. A stand-in removes itself after a
``delete`` that leaves no process naming it; the next install replaces the
stand-ins with the real wrappers; :func:`prune` (for ``doctor``) removes those
that no process names.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
from typing import Any

from nvct.base.errors import NvctError
from nvct.base.fileutil import remove_path
from nvct.config.file import parse_toml

#: The first line of every stand-in (how :func:`prune` knows one).
MARK = "# nvct stand-in:"
#: What a stand-in says to a create (on stderr, and in runc's ``--log`` for the engine to show).
REFUSAL = ("nvct was removed from this node; this stand-in only stops and deletes the containers it left "
           "running (install nvct again to start GPU containers)")


def referencing(paths: list[str], proc: str = "/proc") -> dict[str, list[int]]:
    """``path -> pids`` of the processes that still name one of ``paths`` as their runtime."""
    wanted = {os.path.abspath(p) for p in paths}
    found: dict[str, list[int]] = {}
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return found
    me = os.getpid() if proc == "/proc" else None  # the process asking (prune-standins PATH) needs nothing
    for pid in pids:
        if pid == me:
            continue
        for path in _named_by(os.path.join(proc, str(pid))) & wanted:
            found.setdefault(path, []).append(pid)
    return found


def _named_by(process: str) -> set[str]:
    """Runtime paths a process names: its shim bundle's ``options.json``, its arguments (conmon's ``-r``)."""
    names: set[str] = set()
    try:
        with open(os.path.join(process, "cmdline"), "rb") as f:
            names |= {a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a.startswith(b"/")}
    except OSError:
        return names
    try:
        with open(os.path.join(process, "cwd", "options.json"), "rb") as f:
            options = json.loads(f.read(1 << 16))
        binary = options.get("binary_name") or options.get("BinaryName") if isinstance(options, dict) else None
        if isinstance(binary, str):
            names.add(binary)
    except (OSError, ValueError):
        pass
    return names


def script(path: str, runtimes: list[str]) -> str:
    """The stand-in at ``path``: ``runtimes`` (as the installed config lists them) for every call but create/run."""
    candidates = " ".join(shlex.quote(r) for r in runtimes) or "runc"
    return f"""#!/bin/sh
{MARK} left at {path} when nvct's toolkit was removed while containers it
# started still ran: their engines call this path to stop and delete them. Every call but
# create/run goes to the low-level runtime; nothing is created. After a delete that leaves no
# process naming this path, it removes itself (and its directory, once empty); the next
# `nvct toolkit install` replaces it.
self={shlex.quote(path)}
# nvct_prune: remove this stand-in (and its directory, once empty) unless a process other than
# this one and its caller (the deleted container's shim) names it; without grep and tr, keep it.
nvct_prune() {{
    command -v grep >/dev/null 2>&1 && command -v tr >/dev/null 2>&1 || return 0
    for proc in /proc/[0-9]*; do
        case ${{proc#/proc/}} in "$$"|"$PPID") continue ;; esac
        grep -qsF "\"$self\"" "$proc/cwd/options.json" && return 0
        tr '\0' '\n' < "$proc/cmdline" 2>/dev/null | grep -qxF "$self" && return 0
    done
    rm -f "$self" && rmdir "${{self%/*}}" 2>/dev/null
    return 0
}}
if [ "$1" = --nvct-prune ]; then nvct_prune; exit 0; fi  # the package's removal script, once in place
sub= skip= log= format=
why="{REFUSAL}"
for arg do
    case $skip in
        log) log=$arg; skip=; continue ;;
        format) format=$arg; skip=; continue ;;
        1) skip=; continue ;;
    esac
    case $arg in
        --log|-log) skip=log ;;
        --log=*|-log=*) log=${{arg#*=}} ;;
        --log-format|-log-format) skip=format ;;
        --log-format=*|-log-format=*) format=${{arg#*=}} ;;
        --root|--criu|--rootless|--cgroup-manager|-root|-criu|-rootless|-cgroup-manager) skip=1 ;;
        -*) ;;
        create|run)
            echo "$0: $why" >&2
            # the engine reports what the runtime logged (runc's --log, in --log-format)
            if [ -n "$log" ]; then
                if [ "$format" = json ]; then
                    printf '{{"level":"error","msg":"%s"}}\n' "$why" >> "$log"
                else
                    printf 'level=error msg="%s"\n' "$why" >> "$log"
                fi
            fi
            exit 1 ;;
        *) sub=$arg; break ;;
    esac
done
for runtime in {candidates}; do
    case $runtime in
        /*) [ -x "$runtime" ] || continue ;;
        *) runtime=$(command -v "$runtime") || continue ;;
    esac
    [ "$sub" = delete ] || exec "$runtime" "$@"
    "$runtime" "$@" || exit
    nvct_prune
    exit 0
done
echo "$0: none of {_dq(candidates)} is installed" >&2
exit 1
"""


def remove_toolkit(root: str, wrappers: list[str], runtimes: list[str], log) -> list[str]:
    """Remove the toolkit at ``root``, leaving stand-ins for the ``wrappers`` running containers name.

    Returns the stand-ins left (none when no process names a wrapper: the directory goes whole).
    """
    needed = referencing(wrappers)
    if not needed:
        shutil.rmtree(root)
        return []
    for path in needed:
        tmp = path + ".nvct-standin"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(script(path, runtimes))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    keep = {os.path.relpath(p, root) for p in needed}
    for name in os.listdir(root):
        if name not in keep:
            remove_path(os.path.join(root, name))
    for path, pids in sorted(needed.items()):
        log(f"left a stand-in at {path}: running containers (shim pids {', '.join(map(str, pids))}) still "
            f"need it to be stopped and deleted; it goes with the last of them (or at the next install)")
    return sorted(needed)


def standins(root: str) -> list[str]:
    """The stand-ins in the directory ``root``."""
    out: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    return [path for path in (os.path.join(root, name) for name in names) if is_standin(path)]


def is_standin(path: str) -> bool:
    """Whether ``path`` is a regular file that starts as :func:`script` writes it."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW | os.O_NONBLOCK)) as f:
            return stat.S_ISREG(os.fstat(f.fileno()).st_mode) and \
                f.read(256).startswith(b"#!/bin/sh\n" + MARK.encode())
    except OSError:
        return False


def prune(root: str) -> list[str]:
    """Remove the stand-ins in ``root`` that no process names (and ``root`` once empty); those removed."""
    return prune_paths(standins(root))


def prune_paths(paths: list[str]) -> list[str]:
    """Remove the stand-ins among ``paths`` that no process names (and each one's directory once empty)."""
    found = [p for p in paths if is_standin(p)]
    needed = referencing(found)
    removed = []
    for path in found:
        if path in needed:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:  # it removed itself meanwhile (a delete)
            pass
        removed.append(path)
    for directory in sorted({os.path.dirname(p) for p in removed}):
        try:
            os.rmdir(directory)
        except OSError:  # not empty
            pass
    return removed


def _dq(value: str) -> str:
    return "".join("\\" + c if c in '"$`\\' else c for c in value)


def config_runtimes(config: str, default: tuple = ("runc", "crun")) -> list[str]:
    """``nvidia-container-runtime.runtimes`` of the config at ``config`` (``default`` when unreadable)."""
    try:
        with open(config, "rb") as f:
            table: Any = parse_toml(f.read(), config).get("nvidia-container-runtime", {})
        found = table.get("runtimes")  # AttributeError: not a table
    except (OSError, NvctError, AttributeError):
        found = None
    if isinstance(found, list) and found and all(isinstance(r, str) for r in found):
        return found
    return list(default)
