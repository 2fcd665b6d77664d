"""Tests of nvct.engines: editing docker, containerd and CRI-O configs."""

from __future__ import annotations


def toml_loads(text: str | bytes) -> dict:
    """Parse TOML with the standard library where it exists (3.11+), else tomlkit."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python 3.9/3.10
        import tomlkit

        return tomlkit.parse(text).unwrap()
    return tomllib.loads(text)
