"""The environment nvct's programs run with: the caller's, cut down before the interpreter starts.

Whoever starts a program picks its environment: ``docker --gpus`` gives its hook
dockerd's whole environment, ``ctr --gpus`` the user's shell's, an OCI hook entry
its ``env`` (nvct writes a fixed one, :data:`nvct.edits.model.HOOK_ENV`), and under runc
a createContainer entry without ``env`` the *container's*, cwd its rootfs. Parts of
any of these act on a program before its first instruction: the loader's ``LD_*``,
glibc's ``GCONV_PATH``, ``LOCPATH``, ``NLSPATH``, ``TZDIR``, ``HOSTALIASES``,
Python's ``PYTHON*``. An engine set up with such a variable is not an attack, and
must not break GPU containers.

So the sh front of every program sets each variable aside before it execs the
interpreter: renamed :data:`ASIDE` + name, a name nothing reads (the front keeps none
of the caller's own ``NVCT_ENV_*``). :func:`start`, the program's first call, takes
back what its kind of program needs, by one table:

- a container's steps (``nvidia-cdi-hook``, ``nvct hook``, ``nvidia-ctk hook``) take
  nothing back and run with the fixed ``PATH``: they may run with a container's
  environment, and need none;
- the shim and the prestart hooks (``nvidia-container-runtime``,
  ``nvidia-container-runtime-hook``, ``nvidia-container-cli configure``) take back
  ``PATH`` and nvct's own variables (:data:`_ENGINE`); the shim hands the runtime it
  execs the caller's environment whole (:func:`caller_environ`);
- the management programs take back everything but what acts on the loader, libc or
  Python (:func:`nvct.linux.privileges.is_unsafe_env_name`, ``PYTHON*``): they run the
  user's tools (docker, systemctl) and read the GPU Operator's settings.

The names dropped are logged at debug level once logging is set up (:mod:`nvct.base.log`).
A start refuses only where refusing protects something: a path of nvct's (config
file, roots) that is relative or goes through ``/proc`` would be resolved from the
hook's working directory, a container's rootfs for an entry without ``env`` under
runc. See docs/security.md.
"""

from __future__ import annotations

import os
import sys

#: What the sh fronts prefix every variable of the caller with.
ASIDE = "NVCT_ENV_"
#: PATH of a container's steps (nvct.edits.model.HOOK_PATH; not imported: this runs first on every start).
STEP_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What the shim and the prestart hooks take back from the engine's environment.
_ENGINE = ("PATH", "NVIDIA_CTK_CONFIG_FILE_PATH", "XDG_CONFIG_HOME", "NVCT_LOG_FORMAT", "NVCT_GPU_REQUEST",
           "NVCT_CONFIG_DIGEST", "NVCT_DRIVER_ROOT", "NVCT_DEV_ROOT", "NVCT_PROC_ROOT")
#: Of those, the paths: resolved from the working directory when relative.
_PATHS = ("NVIDIA_CTK_CONFIG_FILE_PATH", "XDG_CONFIG_HOME", "NVCT_DRIVER_ROOT", "NVCT_DEV_ROOT", "NVCT_PROC_ROOT")

#: Each program by name -> the module whose ``main()`` it runs: what nvct/scripts/launcher is
#: installed as, and what nvct.toolkit.entry runs.
PROGRAMS = {
    "nvidia-container-runtime": "nvct.programs.shim",
    "nvidia-container-runtime-hook": "nvct.programs.hook",
    "nvct": "nvct.cli",
    "nvidia-cdi-hook": "nvct.programs.cdi_hook",
    "nvidia-ctk": "nvct.programs.ctk",
    "nvidia-container-cli": "nvct.programs.container_cli",
    "nvidia-ctk-installer": "nvct.programs.installer",
    "nvidia-toolkit": "nvct.programs.installer",
}

#: The caller's environment as the sh front found it (set by :func:`start`).
_caller: dict[str, str] | None = None
#: The names :func:`start` dropped, sorted.
dropped: list[str] = []


def program(path: str) -> str:
    """The program nvct/scripts/launcher runs as ``path``: its name, that name less a ``.suffix``
    (``nvidia-container-runtime.cdi``), or the name of the file a link leads to; else exit 1 with
    one line."""
    name = path.rpartition("/")[2]
    for found in (name, name.rpartition(".")[0], os.path.basename(os.path.realpath(path))):
        if found in PROGRAMS:
            return found
    sys.exit(f"{path}: not the name of one of nvct's programs ({', '.join(PROGRAMS)}): "
             "install or link it under one of them")


def kind(program: str, argv: list[str]) -> str:
    """``step`` (a container's hook step), ``engine`` (the shim, a prestart hook) or ``manage``."""
    if program in ("nvct", "nvidia-ctk"):
        return "step" if argv[1:2] == ["hook"] else "manage"
    if program == "nvidia-cdi-hook":
        return "step"
    if program == "nvidia-container-cli":
        return "engine" if "configure" in argv[1:] else "manage"
    if program in ("nvidia-container-runtime", "nvidia-container-runtime-hook"):
        return "engine"
    return "manage"


def is_hook(program: str, argv: list[str]) -> bool:
    """Whether this start of ``program`` runs as a container's hook (or its shim)."""
    return kind(program, argv) != "manage"


def taken_back(program: str, argv: list[str], caller) -> tuple[dict[str, str], list[str]]:
    """The environment ``program`` runs with, from the caller's, and the names dropped (sorted)."""
    what = kind(program, argv)
    if what == "step":
        env = {"PATH": STEP_PATH}
    elif what == "engine":
        env = {name: caller[name] for name in _ENGINE if name in caller}
    else:
        from nvct.linux.privileges import is_unsafe_env_name

        # TMPDIR is on glibc's list for setuid programs only: a management program keeps it.
        env = {name: value for name, value in caller.items()
               if name == "TMPDIR" or not (is_unsafe_env_name(name) or name.startswith("PYTHON"))}
    return env, sorted(name for name in caller if env.get(name) != caller[name])


def refusal(program: str, argv: list[str], env) -> str | None:
    """Why ``program`` must not run with ``env`` (what :func:`taken_back` kept), or None."""
    if kind(program, argv) != "engine" or program == "nvidia-container-runtime":
        return None  # the shim is no hook: its working directory is the engine's choice
    for name in _PATHS:
        value = env.get(name)
        if value and not _fixed_path(value, name):
            return (f"{name}={value} in its environment is resolved from the working directory; the "
                    f"environment is the engine's (or, for a hook entry without env under runc, the "
                    f"container's, from its rootfs): set an absolute path outside /proc")
    return None


def _in_container_root(program: str, argv: list[str], env) -> str | None:
    """The legacy hook started in its container's rootfs has the *container's* environment: runc
    gives a createContainer entry without ``env`` that, and a prestart hook runs in its bundle. The
    state is read here (and put back on stdin): nvct's variables must not be the image's choice."""
    if program != "nvidia-container-runtime-hook" or "prestart" not in argv[1:]:
        return None
    import io

    text = sys.stdin.read()
    sys.stdin = io.StringIO(text)
    try:
        from nvct.base import jsoncodec

        bundle = jsoncodec.loads(text).get("bundle")
        here = os.getcwd()
        if not isinstance(bundle, str) or os.path.realpath(bundle) == here:
            return None
        from nvct.oci import spec as ocispec

        root = ocispec.rootfs(ocispec.load(bundle), bundle)
    except Exception:  # noqa: BLE001 - the hook reports a bad state or spec itself
        return None
    if os.path.realpath(root) != here:
        return None
    os.environ["PATH"] = STEP_PATH
    steering = [name for name in _ENGINE if name != "PATH" and name in env]
    if steering:
        return (f"{steering[0]} is set in its environment, which is the container's (a hook entry without "
                f"env under runc: it runs in the container's rootfs {here}); give the hook entry an env")
    return None


def _fixed_path(value: str, name: str) -> bool:
    parts = [p for p in value.split("/") if p]
    if not value.startswith("/") or "." in parts or ".." in parts:
        return False
    return parts[:1] != ["proc"] or (name == "NVCT_PROC_ROOT" and parts == ["proc"])


def start(program: str, argv: list[str] | None = None) -> None:
    """Take back what ``program`` needs of the environment its sh front set aside; exit 1 with
    one line where that would be unsafe. A hook then goes on from ``/``."""
    global _caller, dropped
    argv = sys.argv if argv is None else argv
    found = {name: os.environ.pop(name) for name in list(os.environ)}
    caller = {name[len(ASIDE):]: value for name, value in found.items() if name.startswith(ASIDE)}
    # Without the front (no name set aside), all is the caller's; after it, what is not set aside
    # is the interpreter's own (LC_CTYPE of its locale coercion) or a name sh cannot hold: dropped.
    if not caller:
        caller = found
    env, dropped = taken_back(program, argv, caller)
    _caller = caller
    os.environ.update(env)
    why = refusal(program, argv, env) or _in_container_root(program, argv, env)
    if why:
        sys.stderr.write(f"{program}: refusing to run: {why} (see docs/security.md)\n")
        sys.exit(1)
    if is_hook(program, argv) and program != "nvidia-container-runtime":
        os.chdir("/")


def caller_environ() -> dict[str, str]:
    """The environment the program was started with (before :func:`start`): what the shim hands
    the low-level runtime, as the engine would have."""
    return dict(os.environ if _caller is None else _caller)
