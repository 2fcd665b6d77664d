"""Just enough of runc's command line to find the subcommand, bundle, id and log.

Everything is passed on to the low-level runtime unchanged; nvct only reads.
"""

from __future__ import annotations

import os

from nvct.base.record import Record

#: runc/crun global flags that take a value (``--flag value`` or ``--flag=value``; runc, through
#: Go's flag package, takes one dash as well as two for every name).
_GLOBAL_VALUE_FLAGS = {"root", "log", "log-format", "criu", "rootless", "cgroup-manager"}
#: ``create``/``run`` flags that take a value.
_CREATE_VALUE_FLAGS = {"bundle", "b", "console-socket", "pid-file", "preserve-fds"}


class RuncArgs(Record):
    """What nvct needs from the command line."""

    __slots__ = ("subcommand", "bundle", "container_id", "log", "log_format")
    _defaults = {"bundle": None, "container_id": None, "log": None, "log_format": None}
    subcommand: str | None
    bundle: str | None
    container_id: str | None
    log: str | None
    log_format: str | None


def parse(argv: list[str], cwd: str | None = None) -> RuncArgs:
    """Parse ``argv`` (without the program name)."""
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            break
        name, eq, value = _flag(arg)
        if name in _GLOBAL_VALUE_FLAGS:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            values[name] = value
        i += 1
    if i >= len(argv):
        return RuncArgs(None, log=values.get("log"), log_format=values.get("log-format"))
    sub = argv[i]
    bundle = None
    container_id = None
    if sub in ("create", "run"):
        bundle, container_id = _parse_create(argv[i + 1:])
        bundle = os.path.abspath(os.path.join(cwd or os.getcwd(), bundle or "."))
    return RuncArgs(sub, bundle, container_id, values.get("log"), values.get("log-format"))


def _flag(arg: str) -> tuple[str, str, str]:
    """``--name=value`` or ``-name=value``: (name, "=" or "", value)."""
    return arg[2 if arg.startswith("--") else 1:].partition("=")


def _parse_create(args: list[str]) -> tuple[str | None, str | None]:
    bundle = None
    positional = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            name, eq, value = _flag(arg)
            if name in _CREATE_VALUE_FLAGS:
                if not eq:
                    i += 1
                    value = args[i] if i < len(args) else ""
                if name in ("bundle", "b"):
                    bundle = value
        else:
            positional.append(arg)
        i += 1
    return bundle, (positional[-1] if positional else None)
