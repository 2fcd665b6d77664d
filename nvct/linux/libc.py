"""The one ctypes handle on the C library, and the OSError a failed call leaves in errno."""

from __future__ import annotations

import ctypes
import os

#: Opened once per process (``dlopen(NULL)``: the libc the interpreter already has).
libc = ctypes.CDLL(None, use_errno=True)


def oserror(filename: str | None = None) -> OSError:
    """The OSError for the errno the last libc call through :data:`libc` left."""
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), filename)
