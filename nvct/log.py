"""Logging for the shim and hooks: a file from config, stderr, and runc's ``--log``.

Kept to the standard library's ``logging`` so the hot path imports nothing
heavy. Docker and containerd show only the last JSON line of runc's ``--log``
file, so errors are also written there in runc's format.
"""

from __future__ import annotations

import json
import logging
import sys
import time

LOGGER_NAME = "nvct"
logger = logging.getLogger(LOGGER_NAME)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "level": record.levelname.lower().replace("warning", "warn"),
            "msg": record.getMessage(),
            "time": _rfc3339(record.created),
        }
        extra = getattr(record, "fields", None)
        if extra:
            out.update(extra)
        return json.dumps(out, sort_keys=False)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.formatTime(record)} {record.levelname.lower()} {record.getMessage()}"
        extra = getattr(record, "fields", None)
        if extra:
            line += " " + " ".join(f"{k}={json.dumps(v)}" for k, v in extra.items())
        return line


def setup(level: str = "info", path: str | None = None, fmt: str = "text",
          stderr: bool = False) -> logging.Logger:
    """Attach handlers once: a log file (if any) and, optionally, stderr."""
    logger.setLevel(_LEVELS.get(level, logging.INFO))
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    if path and path != "/dev/null":
        try:
            handler = logging.FileHandler(path)
        except OSError:
            handler = None
        if handler is not None:
            handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
            logger.addHandler(handler)
    if stderr:
        err = logging.StreamHandler(sys.stderr)
        err.setFormatter(logging.Formatter("nvct: %(levelname)s: %(message)s"))
        logger.addHandler(err)
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def write_runc_log(path: str | None, level: str, msg: str) -> None:
    """Append one line in runc's JSON log format (what docker shows the user)."""
    if not path:
        return
    line = json.dumps({"level": level, "msg": msg, "time": _rfc3339(time.time())})
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _rfc3339(when: float) -> str:
    # containerd parses runc's log times as RFC 3339 and rejects "+0000".
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
