"""Just enough of runc's command line to find the subcommand, bundle, id and log.

Everything is passed on to the low-level runtime unchanged; nvct only reads. The sh front reads
it the same way without a Python start: :func:`front_sh` writes its reader from the tables here,
into the record it sources (nvct.oci.runtime.FRONTS).
"""

from __future__ import annotations

import os

from nvct.base.record import Record

#: runc/crun global flags that take a value (``--flag value`` or ``--flag=value``; runc, through
#: Go's flag package, takes one dash as well as two for every name).
_GLOBAL_VALUE_FLAGS = {"root", "log", "log-format", "criu", "rootless", "cgroup-manager"}
#: ``create``/``run`` flags that take a value.
_CREATE_VALUE_FLAGS = {"bundle", "b", "console-socket", "pid-file", "preserve-fds"}
#: The ``create``/``run`` flags that name the bundle.
_BUNDLE_FLAGS = ("bundle", "b")
#: The subcommands that make a container from a bundle: the only ones nvct may change.
CREATE_VERBS = ("create", "run")


class RuncArgs(Record):
    """What nvct needs from the command line."""

    __slots__ = ("subcommand", "bundle", "container_id", "log", "log_format", "pid_file", "options")
    _defaults = {"bundle": None, "container_id": None, "log": None, "log_format": None, "pid_file": None,
                 "options": ()}
    subcommand: str | None
    bundle: str | None
    container_id: str | None
    log: str | None
    log_format: str | None
    pid_file: str | None  # create's --pid-file
    options: tuple[str, ...]  # the global options before the subcommand, as given


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
    bundle = container_id = pid_file = None
    if sub in CREATE_VERBS:
        bundle, container_id, pid_file = _parse_create(argv[i + 1:])
        bundle = os.path.abspath(os.path.join(cwd or os.getcwd(), bundle or "."))
    return RuncArgs(sub, bundle, container_id, values.get("log"), values.get("log-format"), pid_file,
                    tuple(argv[:i]))


def _flag(arg: str) -> tuple[str, str, str]:
    """``--name=value`` or ``-name=value``: (name, "=" or "", value)."""
    return arg[2 if arg.startswith("--") else 1:].partition("=")


def _parse_create(args: list[str]) -> tuple[str | None, str | None, str | None]:
    bundle = pid_file = None
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
                if name in _BUNDLE_FLAGS:
                    bundle = value
                elif name == "pid-file":
                    pid_file = value or None
        else:
            positional.append(arg)
        i += 1
    return bundle, (positional[-1] if positional else None), pid_file


def asks_version(argv: list[str]) -> bool:
    """The reference's test: any ``-version``/``--version`` (``=value`` ignored) before the end."""
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name.startswith("-") and name.lstrip("-") == "version":
            return True
    return False


def front_sh() -> str:
    """``nvct_args ARGS``, the sh front's reading of the command line, as :func:`parse` and
    :func:`asks_version` read it: ``sub`` (empty for none), ``create`` (1: one of
    :data:`CREATE_VERBS`), ``bundle`` (of a create or run, as given: relative to the working
    directory), ``format`` (``--log-format``) and ``version`` (1: ``--version`` with no
    subcommand, nvct's lines to print)."""

    def spellings(names, suffix=""):
        return "|".join(f"{d}{n}{suffix}" for n in sorted(names) for d in ("--", "-"))

    others = _GLOBAL_VALUE_FLAGS - {"log-format"}
    return f"""nvct_args() {{
    sub= create= bundle= format= version= nvct_sub= nvct_take=
    for arg do
        case $nvct_take in
            format) format=$arg nvct_take= ; continue ;;
            bundle) bundle=$arg nvct_take= ; continue ;;
            skip) nvct_take= ; continue ;;
        esac
        if [ -z "$nvct_sub" ]; then
            case $arg in
                {spellings(["log-format"])}) nvct_take=format format= ;;
                {spellings(["log-format"], "=*")}) format=${{arg#*=}} ;;
                {spellings(others)}) nvct_take=skip ;;
                -*) ;;
                *) nvct_sub=1 sub=$arg; case $arg in {"|".join(CREATE_VERBS)}) create=1 ;; *) break ;; esac ;;
            esac
            continue
        fi
        case $arg in
            {spellings(_BUNDLE_FLAGS)}) nvct_take=bundle bundle= ;;
            {spellings(_BUNDLE_FLAGS, "=*")}) bundle=${{arg#*=}} ;;
            {spellings(_CREATE_VALUE_FLAGS - set(_BUNDLE_FLAGS))}) nvct_take=skip ;;
        esac
    done
    bundle=${{bundle:-.}}
    [ -z "$nvct_sub" ] || return 0
    for arg do
        arg=${{arg%%=*}}
        case $arg in -*) ;; *) continue ;; esac
        while :; do case $arg in -*) arg=${{arg#-}} ;; *) break ;; esac; done
        if [ "$arg" = version ]; then version=1; return 0; fi
    done
}}
"""
