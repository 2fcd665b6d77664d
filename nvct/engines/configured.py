"""Which engine configs nvct has configured, wherever they are: what package removal undoes.

``nvct runtime configure`` (and the OCI hook file's) records each config it
changed as one small file under ``$NVCT_STATE_DIR/configured`` (default
``/var/lib/nvct``); ``unconfigure`` drops it. The package's removal script
reads the list (:mod:`nvct.toolkit.uninstall`). Without write access (not root) nothing
is recorded: the undo record beside the config still works as before.
"""

from __future__ import annotations

import json
import os

from nvct.base.fileutil import write_atomic

STATE_DIR_ENV = "NVCT_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/nvct"


def directory() -> str:
    return os.path.join(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR, "configured")


def add(path: str, engine: str) -> None:
    """Remember that nvct configured ``engine``'s config at ``path``."""
    try:
        os.makedirs(directory(), mode=0o755, exist_ok=True)
        write_atomic(_entry(path), json.dumps({"engine": engine, "path": os.path.abspath(path)}) + "\n")
    except OSError:
        pass


def remove(path: str) -> None:
    try:
        os.unlink(_entry(path))
    except OSError:
        pass


def entries() -> list[tuple[str, str]]:
    """(engine, config path) for every config nvct configured and has not unconfigured."""
    out: list[tuple[str, str]] = []
    try:
        names = sorted(os.listdir(directory()))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(directory(), name), encoding="utf-8") as f:
                data = json.load(f)
            out.append((str(data["engine"]), str(data["path"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _entry(path: str) -> str:
    name = os.path.abspath(path).replace("%", "%25").replace("/", "%")
    return os.path.join(directory(), name[-200:])
