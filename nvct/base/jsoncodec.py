"""JSON through the C accelerator ``_json`` alone, without importing the ``json`` package.

``json.decoder`` and ``json.encoder`` import ``re`` (and with it ``enum``,
``functools``, ``collections``): ~7 ms on every GPU container start, where
the shim reads and writes config.json and logs one line. The C scanner and
encoder are what ``json.loads``/``json.dumps`` use anyway, so the results are
the same; without ``_json`` (another interpreter) the ``json`` package is used.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """What ``_json.make_scanner`` reads from a JSONDecoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; ValueError (json.JSONDecodeError) on bad input."""
    try:
        import _json
    except ImportError:  # pragma: no cover - CPython always has it
        import json

        return json.loads(text)
    if isinstance(text, (bytes, bytearray)):
        if text[:3] == b"\xef\xbb\xbf" or b"\0" in text[:4]:  # a BOM, UTF-16/32: as json.loads does
            import json

            return json.loads(text)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            import json

            return json.loads(text)  # raises what json.loads raises
    start = _skip(text, 0)
    try:
        value, end = _json.make_scanner(_Context())(text, start)  # type: ignore[arg-type]  # a JSONDecoder's fields
    except (StopIteration, ValueError, SystemError):
        # The C scanner reports errors through json.decoder, which must be imported
        # (else SystemError): bad input is rare, let json.loads say what is wrong.
        import json

        return json.loads(text)
    if _skip(text, end) != len(text):
        import json

        return json.loads(text)  # raises "Extra data"
    return value


def dumps(value: Any, *, compact: bool = False) -> str:
    """``json.dumps(value)`` (``compact``: with ``separators=(",", ":")``)."""
    try:
        from _json import encode_basestring_ascii, make_encoder
    except ImportError:  # pragma: no cover - CPython always has it
        import json

        return json.dumps(value, separators=(",", ":") if compact else None)
    encoder = make_encoder({}, _unserializable, encode_basestring_ascii, None,
                           ":" if compact else ": ", "," if compact else ", ", False, False, True)
    if isinstance(value, (dict, list)):
        return "".join(encoder(value, 0))
    return "".join(encoder([value], 0))[1:-1]  # a scalar (a log field): the C encoder takes containers


def _unserializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos
