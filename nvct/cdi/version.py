"""CDI spec versions, oldest first, and how to compare them.

0.1.0 and 0.2.0 exist but the CDI library rejects them ("must be at least
v0.3.0"), so nvct reads 0.3.0 to 1.1.0. Each minor release added fields
(:mod:`nvct.cdi.schema` has which); 0.8.0 and 1.0.0 changed only the library.
"""

from __future__ import annotations

KNOWN = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
EARLIEST = "0.3.0"
LATEST = KNOWN[-1]
SUPPORTED = KNOWN[KNOWN.index(EARLIEST):]

#: The newest version podman 4.3 (and other runtimes on CDI library 0.5.x) accepts.
WIDELY_READ = "0.5.0"


def normalize(version: object) -> str | None:
    """``"v0.5.0"`` or ``"0.5.0"`` -> ``"0.5.0"``; None for anything not a known version."""
    if not isinstance(version, str):
        return None
    v = version[1:] if version.startswith("v") else version
    return v if v in KNOWN else None


def rank(version: str) -> int:
    """Position in :data:`KNOWN` (a normalized version); higher is newer."""
    return KNOWN.index(version)


def newest(*versions: str) -> str:
    return max(versions, key=rank)
