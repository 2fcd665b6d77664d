"""``nvct hook <name>``: the steps that run inside a starting container.

jit-cdi specs and CDI specs name these as createContainer hooks; the legacy
prestart hook runs the same steps in-process. Names and arguments follow the
reference (``nvidia-ctk hook ...``). ``chain`` runs several in one process,
because every hook process costs an interpreter start on each container start.
An unknown hook warns and exits 0, so a spec from a newer nvct never breaks a start.

No click here: this runs on every container start.
"""

from __future__ import annotations

import sys

from nvct.base.errors import NvctError


def main(argv: list[str]) -> int:
    from nvct.linux import privileges

    privileges.sanitize_environ()
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_usage())
        return 0 if argv else 2
    try:
        from nvct.edits import steps as kinds
        from nvct.hooks import container, steps

        if argv[0] == "chain":
            rootfs, identity, rest = kinds.chain_options(argv[1:])
            if rootfs:  # the shim named the root (and its identity): the state is not needed, nor config.json
                container.drain(sys.stdin)
                ctx = container.HookContext(rootfs=rootfs, same_as=identity)
            else:
                ctx = container.from_state(sys.stdin)
                ctx.same_as = identity or ctx.same_as
            steps.run(kinds.parse(rest), ctx)
        else:
            steps.run(kinds.parse(argv), container.from_state(sys.stdin))
    except NvctError as e:
        sys.stderr.write(f"nvct hook {argv[0]}: {e}\n")
        return 1
    except Exception as e:  # noqa: BLE001 - runc shows stderr to the user: one line, no traceback
        sys.stderr.write(f"nvct hook {argv[0]}: internal error: {type(e).__name__}: {e}\n")
        return 1
    return 0


def _usage() -> str:
    from nvct.hooks.steps import STEPS

    names = ", ".join(sorted(STEPS))
    return (f"usage: nvct hook <name> [args...]\n"
            f"       nvct hook chain [--container-root DIR [--root-identity DEV:INO]] <name> [args...] "
            f"[-- <name> [args...]]...\n"
            f"hooks: {names}\n")
