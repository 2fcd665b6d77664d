"""Atomic file replacement, with an optional backup of what was there.

Config files and OCI specs are never written in place: a crash or a full disk
must leave either the old file or the new one, never half of either.
"""

from __future__ import annotations

import os
import stat


def write_atomic(path: str, data: bytes | str, *, mode: int | None = None,
                 backup: str | None = None, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically.

    The new file keeps the old file's mode (or ``mode``, or 0644). When
    ``backup`` is given and ``path`` exists, the old content is copied there
    first (only once: an existing backup is the original and is kept).
    ``durable=False`` skips fsync, for files nobody needs after a crash (an
    OCI bundle's config.json).
    """
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
        import shutil

        shutil.copy2(path, backup)
    tmp = os.path.join(directory, f".nvct-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
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
