"""The shim's sh front in a directory of its own, with a witness of every Python start.

The front runs ``python3`` from its own directory when there is one (as in a
virtualenv); here that is a script that appends its argv to ``python.log``
and execs the test's interpreter. The hook's front beside it is the hook
legacy mode inserts, and it starts Python the same way, so the log tells the shim's
starts (``-I -S <dir>/nvidia-container-runtime``) from the hook's (``-I -S <dir>/nvidia-container-runtime-hook``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

VENV_BIN = os.path.dirname(sys.executable)
HOOK = "nvidia-container-runtime-hook"


class Front:
    """``Front(dir)``: ``dir/nvidia-container-runtime`` and the hook beside it, with the witness."""

    def __init__(self, directory: str | os.PathLike, shell: str = "/bin/sh"):
        self.dir = os.fspath(directory)
        os.makedirs(self.dir, exist_ok=True)
        self.shim = os.path.join(self.dir, "nvidia-container-runtime")
        self.hook = os.path.join(self.dir, HOOK)
        self.log = os.path.join(self.dir, "python.log")
        for name in ("nvidia-container-runtime", HOOK):
            shutil.copy(os.path.join(VENV_BIN, name), os.path.join(self.dir, name))
        with open(self.shim) as f:
            text = f.read()
        with open(self.shim, "w") as f:  # ``shell``: e.g. "/bin/bash --posix", RHEL's /bin/sh
            f.write(text.replace("#!/bin/sh\n", f"#!{shell}\n", 1))
        python = os.path.join(self.dir, "python3")
        with open(python, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {self.log}\nexec {sys.executable} "$@"\n')
        os.chmod(python, 0o755)
        open(self.log, "w").close()

    def starts(self) -> dict[str, int]:
        """Python starts so far: ``{"shim": n, "hook": m}``."""
        with open(self.log) as f:
            lines = f.read().splitlines()
        started = [[word for word in line.split(" ") if not word.startswith("-")][:1] for line in lines]  # the file
        return {name: started.count([os.path.join(self.dir, program)])
                for name, program in (("shim", "nvidia-container-runtime"), ("hook", HOOK))}


def legacy_config(path: str | os.PathLike, runtime: str, *, base: str = "", extra: str = "",
                  mode: str = "legacy", cgroups: bool = False) -> str:
    """A config at ``path`` (``base``: a node's config text; ``extra``: more keys of
    ``[nvidia-container-runtime]``), old enough to be cached. Without ``cgroups``, it sets
    ``nvidia-container-cli.no-cgroups``: the only legacy config whose GPU creates the front takes
    (with cgroups the shim's Python writes the request's device rules into the spec)."""
    path = os.fspath(path)
    if not cgroups:
        base = with_no_cgroups(base)
    with open(path, "w") as f:
        f.write(f'{base}\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runtime}"]\n{extra}')
    age(path)
    return path


def with_no_cgroups(text: str) -> str:
    """Config ``text`` with ``nvidia-container-cli.no-cgroups = true`` (in its table, if it has one)."""
    if "[nvidia-container-cli]\n" in text:
        return text.replace("[nvidia-container-cli]\n", "[nvidia-container-cli]\nno-cgroups = true\n", 1)
    return f"{text}\n[nvidia-container-cli]\nno-cgroups = true\n"


def age(path: str, seconds: float = 60) -> None:
    """An mtime in the past: the shim records a config only once it is older than 2 s."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def prime(front: Front, config: str) -> None:
    """Have the shim's Python record ``config`` (a ``state`` call; the runtime's answer is ignored)."""
    subprocess.run([front.shim, "state", "nvct-prime"], env=shim_env(config), capture_output=True, timeout=60)


def gpu_front(directory: str | os.PathLike, node_config: str, runtime: str, *,
              cgroups: bool = False) -> tuple[Front, str]:
    """A front in ``directory``/bin and a recorded legacy config there for the simulated node
    (its config file ``node_config``) on low-level ``runtime``: GPU creates start no Python
    (``cgroups``: the default ``no-cgroups = false``, where they do; see :func:`legacy_config`)."""
    front = Front(os.path.join(os.fspath(directory), "bin"))
    with open(node_config) as f:
        config = legacy_config(os.path.join(os.fspath(directory), "legacy.toml"), runtime, base=f.read(),
                               cgroups=cgroups)
    prime(front, config)
    return front, config


def entry(front: Front, config: str) -> str:
    """A program beside ``front.dir`` that execs the front under ``config``: what an engine's
    runtime entry names (daemon.json and containerd's runtimes pass no env of their own)."""
    path = os.path.join(os.path.dirname(front.dir), "nvidia-legacy")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexport NVIDIA_CTK_CONFIG_FILE_PATH={config}\nexec {front.shim} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def run(front: Front, config: str, bundle: str | os.PathLike, log_file: str | None = None):
    """The container of ``bundle`` through ``front`` under ``config`` (tests.support.runtimes.run_container)."""
    from .runtimes import run_container

    return run_container([front.shim], bundle, log_file=log_file, env=shim_env(config))


def shim_env(config: str) -> dict[str, str]:
    """The environment an engine gives the shim: its PATH, and the config file."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVIDIA_CTK_CONFIG_FILE_PATH": config}


def request_specs(pieces: list[str], max_pieces: int):
    """Hypothesis specs whose env, annotations and mount destinations are run together from ``pieces``.

    The pieces are the names a GPU request may use, whole, cut and escaped: a
    front must decide on such a spec as nvct.request.container.might_request_gpu does.
    """
    from hypothesis import strategies as st

    text = st.lists(st.sampled_from(pieces), max_size=max_pieces).map("".join)
    return st.fixed_dictionaries({"root": st.just({"path": "rootfs"})}, optional={
        "process": st.fixed_dictionaries({"env": st.lists(text, max_size=3)}),
        "annotations": st.dictionaries(text, text, max_size=2),
        "mounts": st.lists(st.fixed_dictionaries({"destination": text, "source": st.just("/dev/null")}), max_size=2),
    })


def write_spec(bundle: str, spec: dict, *, ascii_only: bool) -> bytes:
    """``bundle``/config.json as an engine writes it (one line; non-ASCII as is or escaped): its bytes."""
    import json

    raw = json.dumps(spec, ensure_ascii=ascii_only, separators=(",", ":")).encode()
    with open(os.path.join(bundle, "config.json"), "wb") as f:
        f.write(raw)
    return raw
