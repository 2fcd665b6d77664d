"""Atomic file replacement, with an optional backup of what was there.

Config files and OCI specs are never written in place: a crash or a full disk
must leave either the old file or the new one, never half of either.
"""

from __future__ import annotations

import os
import stat


def write_atomic(path: str, data: bytes | str, *, mode: int | None = None,
                 backup: str | None = None) -> None:
    """Replace ``path`` with ``data`` atomically.

    The new file keeps the old file's mode (or ``mode``, or 0644). When
    ``backup`` is given and ``path`` exists, the old content is copied there
    first (only once: an existing backup is the original and is kept).
    """
    import shutil
    import tempfile

    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        st = os.stat(path)
        keep_mode = stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        st = None
        keep_mode = 0o644
    if backup and st is not None and not os.path.exists(backup):
        shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(prefix=".nvct-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, keep_mode if mode is None else mode)
        if st is not None:
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:
                pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
