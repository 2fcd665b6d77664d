"""Logging for the shim and hooks: a file from config, stderr, and runc's ``--log``.

A few lines of our own instead of the standard library's ``logging``, which
costs ~4 ms to import on every container start. Each record is one line,
text or JSON (``--log-format json``), with optional structured fields.
Docker and containerd show only the last JSON line of runc's ``--log`` file,
so errors are also written there in runc's format.
"""

from __future__ import annotations

import sys
import time

from nvct.base import jsoncodec  # not the json package: it imports re (~7 ms per start)

_LEVELS = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40}


class Logger:
    """Writes records at or above ``level`` to every attached stream."""

    def __init__(self) -> None:
        self.level = _LEVELS["info"]
        self.fmt = "text"
        self._streams: list = []
        self._stderr = False

    def setup(self, level: str = "info", path: str | None = None, fmt: str = "text",
              stderr: bool = False) -> Logger:
        self.close()
        self.level = _LEVELS.get(level, _LEVELS["info"])
        self.fmt = fmt
        self._stderr = stderr
        if path and path != "/dev/null":
            try:
                self._streams.append(open(path, "a", encoding="utf-8"))
            except OSError:
                pass
        started = sys.modules.get("nvct.oci.environ")  # the caller's variables this program dropped
        if started is not None and started.dropped:
            self.debug("environment: dropped %s (names only; nvct.oci.environ)", " ".join(started.dropped))
        return self

    def close(self) -> None:
        for stream in self._streams:
            stream.close()
        self._streams = []

    def is_enabled_for(self, level: str) -> bool:
        return _LEVELS[level] >= self.level

    def debug(self, msg: str, *args, fields: dict | None = None) -> None:
        self._log("debug", msg, args, fields)

    def info(self, msg: str, *args, fields: dict | None = None) -> None:
        self._log("info", msg, args, fields)

    def warning(self, msg: str, *args, fields: dict | None = None) -> None:
        self._log("warning", msg, args, fields)

    def error(self, msg: str, *args, fields: dict | None = None) -> None:
        self._log("error", msg, args, fields)

    def _log(self, level: str, msg: str, args: tuple, fields: dict | None) -> None:
        if _LEVELS[level] < self.level or not (self._streams or self._stderr):
            return
        text = msg % args if args else msg
        now = time.time()
        for stream in self._streams:
            stream.write(self._format(level, text, fields, now) + "\n")
            stream.flush()
        if self._stderr:
            sys.stderr.write(f"nvct: {level}: {text}\n")

    def _format(self, level: str, text: str, fields: dict | None, now: float) -> str:
        name = "warn" if level == "warning" else level
        if self.fmt == "json":
            record = {"level": name, "msg": text, "time": _rfc3339(now)}
            record.update(fields or {})
            return jsoncodec.dumps(record)
        line = f"{_rfc3339(now)} {name} {text}"
        if fields:
            line += " " + " ".join(f"{k}={jsoncodec.dumps(v)}" for k, v in fields.items())
        return line


logger = Logger()


def setup(level: str = "info", path: str | None = None, fmt: str = "text", stderr: bool = False) -> Logger:
    """Configure the process-wide logger (called once by each entry point)."""
    return logger.setup(level, path, fmt, stderr)


def write_runc_log(path: str | None, level: str, msg: str) -> None:
    """Append one line in runc's JSON log format (what docker shows the user)."""
    if not path:
        return
    line = jsoncodec.dumps({"level": level, "msg": msg, "time": _rfc3339(time.time())})
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def _rfc3339(when: float) -> str:
    # containerd parses runc's log times as RFC 3339 and rejects "+0000".
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
