"""The sh fronts read what Python reads: the sh that nvct.oci.runtime.FRONTS carries, run on the
same inputs as the Python it is written from (runc's command line, the config file's path)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import given, strategies as st

from nvct.config import file as config_file
from nvct.oci import runcargs

#: dash is Debian's /bin/sh, bash RHEL's.
SHELLS = (["/bin/sh"], ["/bin/bash", "--posix"])
CWD = "/c"


def _q(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _sh(shell: list[str], script: str, env: dict[str, str] | None = None) -> list[str]:
    out = subprocess.run([*shell, "-c", script], capture_output=True, check=True, env=env or {}).stdout
    return out.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _flag_words() -> list[str]:
    names = {"root", "log", "log-format", "criu", "rootless", "cgroup-manager", "bundle", "b",
             "console-socket", "pid-file", "preserve-fds", "version", "systemd-cgroup", "debug", "x"}
    return [f"{d}{n}{tail}" for n in sorted(names) for d in ("-", "--", "---") for tail in ("", "=", "=v", "=a=b")]


WORDS = st.sampled_from([*_flag_words(), "create", "run", "start", "delete", "state", "", "-", "--", "b1",
                         "/abs/b", "json", "text", "id", "--version", "-version=1", "a b", "it's"])
ARGV = st.lists(st.one_of(WORDS, st.text(min_size=0, max_size=6).filter(lambda s: "\0" not in s)), max_size=8)


def _python(argv: list[str]) -> tuple[str, str, str, str]:
    args = runcargs.parse(argv, cwd=CWD)
    create = args.subcommand in runcargs.CREATE_VERBS
    version = args.subcommand is None and runcargs.asks_version(argv)
    return ("1" if create else "", args.bundle if create else "", args.log_format or "", "1" if version else "")


def _front(shell: list[str], argvs: list[list[str]]) -> list[tuple[str, str, str, str]]:
    lines = [runcargs.front_sh()]
    for argv in argvs:
        lines.append(f"nvct_args {' '.join(_q(a) for a in argv)}")
        lines.append('printf "%s\\0" "$create" "$bundle" "$format" "$version"')
    out = _sh(shell, "\n".join(lines) + "\n")
    got = [tuple(out[i:i + 4]) for i in range(0, len(out), 4)]
    # the bundle as the front uses it: relative to runc's working directory
    return [(c, os.path.abspath(os.path.join(CWD, b)) if c else "", f, v) for c, b, f, v in got]


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "bash"])
@given(argvs=st.lists(ARGV, min_size=1, max_size=20))
def test_the_front_reads_runcs_command_line_as_python_does(shell, argvs):
    assert _front(shell, argvs) == [_python(a) for a in argvs]


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "bash"])
def test_the_front_reads_the_command_lines_engines_write_as_python_does(shell):
    argvs = [["--root", "/run/docker/runtime-runc/moby", "--log", "/x/log.json", "--log-format", "json", "create",
              "--bundle", "/b", "--pid-file", "/p", "id"],
             ["--root=/r", "-log-format=text", "run", "-b", "rel", "--console-socket", "/s", "id"],
             ["--version"], ["-root", "--version"], ["start", "id"], ["create", "id"], ["create", "--bundle"],
             ["--log-format", "create", "--b=/x", "id"], ["", "create", "-b", "/x"]]
    assert _front(shell, argvs) == [_python(a) for a in argvs]


PATHS = [None, "", "/a/config.toml", "rel.toml", "/sp ace/it's.toml", "/"]
HOMES = [None, "", "/x", "/x/", "x", "/x//", "/", "/a'b c"]


@pytest.mark.parametrize("shell", SHELLS, ids=["dash", "bash"])
def test_the_front_finds_the_config_file_as_python_does(shell):
    envs = [{k: v for k, v in ((config_file.CONFIG_ENV, path), ("XDG_CONFIG_HOME", home)) if v is not None}
            for path in PATHS for home in HOMES]
    got = [_sh(shell, config_file.default_path_sh() + 'printf "%s\\0" "$config"\n', env)[0] for env in envs]
    assert got == [config_file.default_path(env) for env in envs]
