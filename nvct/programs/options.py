"""A GNU-style option parser for the C programs' command lines (argp's rules).

``--name``, ``--name=VALUE``, ``--name VALUE``, ``-x``, ``-xVALUE``,
``-x VALUE``, bundled short flags (``-kn``), ``--`` ends the options.
Options take a value always, never, or only when attached (argp's
OPTION_ARG_OPTIONAL: ``--user=UID``, ``-uUID``). Unique prefixes of long
names are accepted, as argp does. argparse is not used: it imports ``re``
and gettext, which every container start would pay for.
"""

from __future__ import annotations

from nvct.base.errors import NvctError
from nvct.base.record import Record

NO, YES, OPTIONAL = 0, 1, 2


class UsageError(NvctError):
    """A bad command line: one line naming the option at fault."""


class Option(Record):
    """One option: its long name, short letter, whether it takes a value (NO, YES, OPTIONAL), repeatable."""

    __slots__ = ("name", "short", "arg", "repeat")
    _defaults = {"short": None, "arg": NO, "repeat": False}
    name: str
    short: str | None
    arg: int
    repeat: bool


def parse(argv: list[str], options: list[Option], *, in_order: bool = False) -> tuple[dict, list[str]]:
    """``(values, operands)``: flags are True, values strings (lists when ``repeat``).

    ``in_order`` stops at the first operand (the global options before a
    command); otherwise options and operands may interleave.
    """
    longs = {o.name: o for o in options}
    shorts = {o.short: o for o in options if o.short}
    values: dict = {}
    operands: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            operands.extend(argv[i:])
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            opt = _long(longs, name)
            if opt.arg == YES and not eq:
                if i >= len(argv):
                    raise UsageError(f"option '--{opt.name}' requires an argument")
                value, i = argv[i], i + 1
            elif opt.arg == NO and eq:
                raise UsageError(f"option '--{opt.name}' doesn't allow an argument")
            _store(values, opt, value if (eq or opt.arg == YES) else True)
        elif arg.startswith("-") and arg != "-":
            j = 1
            while j < len(arg):
                if arg[j] not in shorts:
                    raise UsageError(f"invalid option -- '{arg[j]}'")
                opt = shorts[arg[j]]
                rest = arg[j + 1:]
                if opt.arg == NO:
                    _store(values, opt, True)
                    j += 1
                    continue
                if rest:
                    _store(values, opt, rest)
                elif opt.arg == YES:
                    if i >= len(argv):
                        raise UsageError(f"option requires an argument -- '{arg[j]}'")
                    _store(values, opt, argv[i])
                    i += 1
                else:
                    _store(values, opt, True)
                break
        else:
            operands.append(arg)
            if in_order:
                operands.extend(argv[i:])
                break
    return values, operands


def _long(longs: dict, name: str) -> Option:
    if name in longs:
        return longs[name]
    matches = [o for n, o in longs.items() if n.startswith(name)] if name else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"option '--{name}' is ambiguous")
    raise UsageError(f"unrecognized option '--{name}'")


def _store(values: dict, opt: Option, value) -> None:
    if opt.repeat:
        values.setdefault(opt.name, []).append(value)
    else:
        values[opt.name] = value
