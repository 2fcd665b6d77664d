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
        from nvct.hooks import container, steps

        if argv[:2] == ["chain", "--container-root"] and len(argv) > 2:
            # jit-cdi: the shim named the root, so neither stdin nor config.json is read
            ctx = container.HookContext(rootfs=argv[2])
            steps.run_chain(argv[3:], ctx)
        elif argv[0] == "chain":
            steps.run_chain(argv[1:], container.from_state(sys.stdin))
        else:
            steps.run_chain(argv, container.from_state(sys.stdin))
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
            f"       nvct hook chain [--container-root DIR] <name> [args...] [-- <name> [args...]]...\n"
            f"hooks: {names}\n")
