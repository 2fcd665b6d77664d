"""Stand-ins that a removed toolkit or package left at its runtime paths.

Engines call the runtime path they recorded per container to stop and delete
it; when nvct is removed while such containers run, a stand-in
(:mod:`nvct.toolkit.standin`) keeps that path working and goes with the last
container that names it. One that no process names any more (its container
was killed outside the engine, or its shim died) stays until the next install
or ``nvct toolkit prune-standins``: that is what this check finds.
"""

from __future__ import annotations

import os

from nvct.doctor.model import Context, info, ok, warn
from nvct.toolkit import standin
from nvct.toolkit.uninstall import RUNTIMES


def places(toolkit_dirs: tuple[str, ...]) -> list[str]:
    """Every stand-in in ``toolkit_dirs`` and at the package's runtime paths."""
    found = [p for d in toolkit_dirs for p in standin.standins(d)]
    return found + [p for p in RUNTIMES if p not in found and standin.is_standin(p)]


def check_standins(ctx: Context):
    dirs = tuple(os.path.abspath(d) for d in ctx.options.toolkit_dirs)
    found = places(dirs)
    if not found:
        yield ok("toolkit.standins", f"no stand-in of a removed nvct (in {', '.join(dirs) or 'no toolkit directory'} "
                 f"or at the package's runtime paths)")
        return
    needed = standin.referencing(found)
    for path in found:
        if path in needed:
            pids = ", ".join(map(str, needed[path]))
            yield info("toolkit.standins", f"{path} is a stand-in left when nvct was removed: running containers "
                       f"(pids {pids}) still need it to be stopped and deleted; it goes with the last of them")
        else:
            yield warn("toolkit.standins", f"{path} is a stand-in left when nvct was removed, and no process names it "
                       f"any more (its container was deleted outside its engine, or its shim died): "
                       f"anything still configured to run it gets 'nvct was removed from this node'",
                       f"nvct toolkit prune-standins {path} (where nvct is gone too: {path} --nvct-prune)")


CHECKS = (check_standins,)
