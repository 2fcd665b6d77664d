"""``nvidia-cdi-hook``: the reference's hook program, running nvct's hook steps.

CDI specs written by NVIDIA's tools (``nvidia-ctk cdi generate``, the k8s
device plugin, the DRA driver, ``nvidia-cdi-refresh``) name
``/usr/bin/nvidia-cdi-hook`` (or the operator's toolkit directory's copy)
with ``create-symlinks --link T::L``, ``update-ldcache --folder F``,
``create-soname-symlinks --folder F``,
``enable-cuda-compat --host-driver-version V``,
``disable-device-node-modification`` (or its newer name ``update-nvidia-params``), ``chmod --mode M --path P``,
``update-application-profile`` and the createRuntime hook ``apply-cuda-memory-limits --driver-root R
--gpu-id UUID``. Each is the step of the same name in
:mod:`nvct.hooks.steps`; an unknown name warns and exits 0, so a spec from a
newer reference never stops a container.

Global flags: ``--debug/-d`` and ``--quiet`` (accepted; nvct's steps say
only what fails), ``--version``/``-v``, ``--help``/``-h``. The hidden
``--container-spec FILE`` of each hook reads the OCI state from FILE
instead of stdin (``-`` or empty: stdin).
"""

from __future__ import annotations

import sys

PROG = "nvidia-cdi-hook"
_GLOBAL_FLAGS = ("--debug", "-d", "--quiet")


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = sys.argv[1:] if argv is None else argv
    while argv and (argv[0] in _GLOBAL_FLAGS or argv[0].startswith(("--debug=", "--quiet="))):
        argv = argv[1:]
    if argv and argv[0] in ("--version", "-v", "version"):
        from nvct.programs.version import banner

        sys.stdout.write(banner(PROG))
        return 0
    if not argv or argv[0] in ("--help", "-h", "help"):
        from nvct.hooks.steps import STEPS

        sys.stdout.write(f"usage: {prog} [--debug] [--quiet] <hook> [flags...]\n"
                         f"hooks: {', '.join(sorted(STEPS))}\n")
        return 0 if argv else 1
    return run_hook(argv[0], argv[1:])


def run_hook(name: str, args: list[str]) -> int:
    """One hook by the reference's name; ``--container-spec`` replaces stdin.

    ``chain`` is nvct's own (its jit-cdi and CDI hooks, when ``nvidia-ctk.path``
    names this program); a leading ``hook`` (``nvidia-ctk``'s form) is accepted.
    """
    from nvct.hooks.steps import STEPS

    if name == "hook" and args:
        name, args = args[0], args[1:]
    if name == "chain":
        from nvct.hooks import main as hook_main

        return hook_main([name, *args])

    if name not in STEPS:  # before reading any state: a newer spec's hook never stops a start
        sys.stderr.write(f"{PROG}: unknown hook {name!r}, ignored (from a newer release?)\n")
        return 0
    args, state_file = _container_spec(args)
    if state_file:
        try:
            sys.stdin = open(state_file, encoding="utf-8")  # read once, closed at exit
        except OSError as e:
            sys.stderr.write(f"{PROG} {name}: --container-spec {state_file}: {e.strerror}\n")
            return 1
    from nvct.hooks import main as hook_main

    return hook_main([name, *args])


def _container_spec(args: list[str]) -> tuple[list[str], str | None]:
    out: list[str] = []
    path = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--container-spec" and i + 1 < len(args):
            path, i = args[i + 1], i + 2
            continue
        if arg.startswith("--container-spec="):
            path = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    return out, (path if path not in (None, "", "-") else None)
