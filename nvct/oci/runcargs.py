"""Just enough of runc's command line to find the subcommand, bundle, id and log.

Everything is passed on to the low-level runtime unchanged; nvct only reads.
"""

from __future__ import annotations

import os

#: runc/crun global flags that take a value (``--flag value`` or ``--flag=value``; runc, through
#: Go's flag package, takes one dash as well as two for every name).
_GLOBAL_VALUE_FLAGS = {"root", "log", "log-format", "criu", "rootless", "cgroup-manager"}
#: ``create``/``run`` flags that take a value.
_CREATE_VALUE_FLAGS = {"bundle", "b", "console-socket", "pid-file", "preserve-fds"}


class RuncArgs:
    """What nvct needs from the command line (a plain class: dataclasses cost ~7 ms to import)."""

    __slots__ = ("subcommand", "bundle", "container_id", "log", "log_format")

    def __init__(self, subcommand: str | None, bundle: str | None = None, container_id: str | None = None,
                 log: str | None = None, log_format: str | None = None):
        self.subcommand = subcommand
        self.bundle = bundle
        self.container_id = container_id
        self.log = log
        self.log_format = log_format

    def __repr__(self) -> str:
        return f"RuncArgs({', '.join(f'{k}={getattr(self, k)!r}' for k in self.__slots__)})"


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
