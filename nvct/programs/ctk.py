"""``nvidia-ctk``: the reference's management CLI, mapped onto ``nvct``'s.

The verbs are nvct's, which take the reference's names and flags:
``runtime configure --runtime=docker|containerd|crio``, ``cdi generate``,
``cdi list``, ``cdi transform root``, ``config`` (``--set``, ``--in-place``,
``default``), ``system create-device-nodes``, ``system
create-dev-char-symlinks``. ``hook <name> ...`` is ``nvidia-cdi-hook
<name> ...`` and is dispatched before click is imported: specs written by
older reference releases run ``nvidia-ctk hook`` on every container start.
Global ``--debug/-d`` and ``--quiet`` are taken before the verb.
"""

from __future__ import annotations

import sys

PROG = "nvidia-ctk"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = False
    while argv and argv[0] in ("--debug", "-d", "--quiet"):
        debug = debug or argv[0] != "--quiet"
        argv = argv[1:]
    if argv and argv[0] in ("--version", "-v", "version"):
        from nvct.programs.version import banner

        sys.stdout.write(banner(PROG))
        return 0
    if argv and argv[0] == "hook":
        from nvct.programs.cdi_hook import main as hook_main

        return hook_main(argv[1:], prog=f"{PROG} hook")
    from nvct.cli import main as nvct_main

    return nvct_main((["--debug"] if debug else []) + argv)
