"""Refreshing a container's ld.so cache without trusting the container.

Injected driver libraries are found by the container's dynamic loader only
once its ``/etc/ld.so.cache`` knows them. ldconfig writes that cache and
creates SONAME symlinks in every library directory, so a hostile image can
aim it at the host with symlinks (CVE-2025-23267) or run its own code with
the hook's privileges if the image's ldconfig is used. Here:

* the folder list goes into ``/etc/ld.so.conf.d/`` through :class:`Rootfs`;
* the host's ldconfig runs, never the image's: it must be statically linked
  (nothing loaded from the container), is opened before the chroot and
  executed from that fd;
* it runs in a child that is in a private mount namespace with procfs and
  other pseudo filesystems under the root detached (their magic links, like
  ``/proc/1/root``, lead out of any chroot), chrooted into the root, with
  only DAC capabilities, no_new_privs, a fixed environment, no inherited fds,
  in new network and IPC namespaces, and a time limit.

Symlinks the image planted then resolve inside the root, like everything the
chrooted ldconfig touches.

Call this in the container's mount namespace (see nvct.linux.namespaces), where the
injected libraries are mounted.
"""

from __future__ import annotations

import fcntl
import os
import time

from nvct.base.errors import ContainerError
from nvct.rootfs.root import Rootfs

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

CONF_PATH = "/etc/ld.so.conf.d/00-nvct-driver.conf"
CACHE_PATH = "/etc/ld.so.cache"  # also nvct.rootfs.cachepatch's
DEFAULT = "@/sbin/ldconfig"  # the config's default: the host's /sbin/ldconfig


class ReadOnlyRootfsError(ContainerError):
    """The container's /etc is on a read-only mount: its ld cache cannot change.

    Raised rather than warned about: injected libraries outside the loader's
    default directories would silently not be found. Callers that know every
    library went to a default directory may catch this and carry on.
    """


def host_ldconfig_path(value: str) -> str:
    """The host path of ldconfig from a config value.

    ``"@/sbin/ldconfig"`` (NVIDIA's syntax for a host path) and
    ``"/sbin/ldconfig"`` both mean the host's binary: nvct never runs the
    image's ldconfig, since that would be image code running as the hook.
    Like NVIDIA's toolkit, ``X`` and ``X.real`` mean ``X.real`` where that
    exists, else ``X``: Ubuntu's /sbin/ldconfig is a shell wrapper around
    /sbin/ldconfig.real, which other distributions lack. Where neither
    exists the configured path is kept, for the error to name it.
    """
    path = value[1:] if value.startswith("@") else value
    if not path.startswith("/"):
        raise ContainerError(f"ldconfig {value!r}: must be an absolute host path "
                             "(e.g. '@/sbin/ldconfig')")
    plain = path[:-len(".real")] if path.endswith(".real") else path
    return next((p for p in (plain + ".real", plain) if os.path.exists(p)), path)


def open_static_executable(path: str) -> int:
    """An O_RDONLY fd on ``path`` after checking it is a static ELF executable.

    A dynamic ldconfig would, once chrooted, load its libc from the image.
    """
    from nvct.linux import elf  # only where an ldconfig is configured or runs

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ContainerError(f"ldconfig {path}: {e.strerror}") from None
    try:
        problem = elf.static_problem(fd)
        if problem:
            raise ContainerError(f"ldconfig {path}: {_PROBLEMS.get(problem, problem)}")
        return fd
    except BaseException:
        os.close(fd)
        raise


#: nvct.linux.elf.static_problem's answers, said for an ldconfig.
_PROBLEMS = {
    "not an ELF file": "not an ELF executable (a wrapper script? on Ubuntu use '@/sbin/ldconfig.real')",
    "malformed ELF header": "malformed ELF header",
    "not an ELF executable": "not an ELF executable",
    "truncated ELF program headers": "truncated ELF program headers",
    "dynamically linked": ("dynamically linked; a static ldconfig is required (it runs "
                           "chrooted in the container, whose libraries must not be loaded)"),
}


def _check_folder(folder: str) -> str:
    if (not isinstance(folder, str) or not folder.startswith("/")
            or any(c in folder for c in "\0\n\r")):
        raise ContainerError(f"library folder {folder!r}: must be an absolute container path")
    return "/" + "/".join(p for p in folder.split("/") if p not in ("", "."))


def update_ldcache(root: Rootfs | str, folders: Sequence[str], *, libraries: Sequence[str] = (),
                   ldconfig: str = DEFAULT, timeout: float = 10.0) -> str:
    """Make the container ``root`` find libraries in ``folders``.

    Writes the folders to :data:`CONF_PATH` (replacing an earlier one; it is
    left there so later ldconfig runs in the container keep them), passes
    them on ldconfig's command line too (the image's /etc/ld.so.conf may not
    include ld.so.conf.d), and runs the host's ldconfig chrooted into the
    root. With no folders only the cache is rebuilt. Returns ldconfig's
    output (warnings). Raises :class:`ReadOnlyRootfsError` when the root's
    /etc is read-only, ContainerError on any other failure.

    ``libraries``: the container paths of the injected libraries and their
    links, every name ldconfig would enter from ``folders`` (each entry named
    by its basename). When given, the image's own cache gets exactly those
    entries added (:func:`patched_cache`) and ldconfig does not run, unless
    that cannot be done exactly.

    ``root``: the caller's opened root (left open), or its path (opened here).
    """
    folders = [_check_folder(f) for f in folders]
    libraries = [_check_folder(p) for p in libraries]
    exe = open_static_executable(host_ldconfig_path(ldconfig))
    try:
        with _opened(root) as root:
            writable = _writable_etc(root, folders)
            with _etc_lock(root, timeout):
                patch = patched_cache(root, libraries) if libraries else None
                _write_conf(root, folders)
                if patch is not None:
                    _write_cache(root, *patch)
                    return ""
                from nvct.rootfs import sandbox  # only here: the patch above is the usual way
                from nvct.rootfs.ldconf import check_conf

                check_conf(root)
                return sandbox.run(root, exe, ["ldconfig", "-C", CACHE_PATH, *folders],
                                   timeout, ldconfig, writable)
    finally:
        os.close(exe)


def patch_ldcache(root: Rootfs | str, folders: Sequence[str], libraries: Sequence[str], *,
                  host_files: dict[str, str], planned: tuple[bytes, bytes] | None = None,
                  timeout: float = 10.0) -> bool:
    """:func:`update_ldcache` done by patching alone, before the libraries are mounted.

    ``host_files`` maps each of ``libraries`` to the host file it will show
    (read for its ELF headers). ``planned``: a :func:`patched_cache` result
    computed earlier, used when the cache still holds those bytes. False,
    with nothing written, where only ldconfig could do it; the caller then
    leaves the step to the hook.
    """
    folders = [_check_folder(f) for f in folders]
    libraries = [_check_folder(p) for p in libraries]
    with _opened(root) as root:
        if not root.exists(CACHE_PATH):
            return False
        _writable_etc(root, folders)
        with _etc_lock(root, timeout):
            patch = planned if planned and _still(root, planned[0]) else patched_cache(root, libraries, host_files)
            if patch is None:
                return False
            _write_conf(root, folders)
            _write_cache(root, *patch)
            return True


class _opened:
    """``root`` itself (the caller's, left open), or the root at that path, opened here and closed."""

    def __init__(self, root: Rootfs | str):
        if isinstance(root, Rootfs):
            self._own: Rootfs | None = None
            self._root = root
        else:
            self._own = self._root = Rootfs(root)

    def __enter__(self) -> Rootfs:
        return self._root

    def __exit__(self, *exc: object) -> None:
        if self._own is not None:
            self._own.close()


def _still(root: Rootfs, data: bytes) -> bool:
    try:
        return root.read_file(CACHE_PATH, limit=len(data) + 1) == data
    except ContainerError:
        return False


def _writable_etc(root: Rootfs, folders: Sequence[str]) -> list[str]:
    if root.is_read_only("/etc" if root.exists("/etc") else "/"):
        raise ReadOnlyRootfsError(
            f"/etc in container root {root.path} is read-only: cannot update "
            f"{CACHE_PATH} for {', '.join(folders) or 'injected libraries'}")
    root.makedirs("/etc")
    return _writable(root, ["/etc", *folders])


def _write_conf(root: Rootfs, folders: Sequence[str]) -> None:
    if folders:
        text = "# Written by nvct: driver libraries injected into this container.\n"
        root.write_file(CONF_PATH, text + "".join(f + "\n" for f in folders), 0o644, replace=True,
                        sweep=True)  # under _etc_lock


def _write_cache(root: Rootfs, data: bytes, patched: bytes) -> None:
    if patched is not data:  # else the loader finds every entry already (a restarted container)
        root.write_file(CACHE_PATH, patched, 0o644, replace=True, sweep=True)  # under _etc_lock

def patched_cache(root: Rootfs, libraries: Sequence[str],
                  host_files: dict[str, str] | None = None) -> tuple[bytes, bytes] | None:
    """The root's ld cache and that cache with ``libraries`` added; see nvct.rootfs.cachepatch.

    Imported only here: the patch needs the cache reader, which ldconfig's own run does not.
    """
    from nvct.rootfs import cachepatch

    return cachepatch.patched_cache(root, libraries, host_files)


def create_soname_links(root: Rootfs | str, folders: Sequence[str], *,
                        ldconfig: str = DEFAULT, timeout: float = 10.0) -> str:
    """The SONAME links of the libraries in ``folders`` only (``ldconfig -n``), no cache.

    The reference's ``create-soname-symlinks`` hook. Runs exactly like
    :func:`update_ldcache` (host ldconfig, sandboxed, chrooted), writing only
    in ``folders``; folders the root does not have are skipped.
    """
    folders = [_check_folder(f) for f in folders]
    exe = open_static_executable(host_ldconfig_path(ldconfig))
    try:
        with _opened(root) as root:
            folders = [f for f in folders if root.exists(f)]
            if not folders:
                return ""
            writable = _writable(root, folders)
            from nvct.rootfs import sandbox

            return sandbox.run(root, exe, ["ldconfig", "-n", *folders], timeout, ldconfig, writable)
    finally:
        os.close(exe)


def _writable(root: Rootfs, paths: Sequence[str]) -> list[str]:
    """Where ldconfig may write (the cache's /etc, the folders' links), checked onto the mount
    each path names; every other mount under the root it only reads (_freeze_other_mounts)."""
    present = [p for p in paths if root.exists(p)]
    for path in present:
        root.check_same_mount(path)
    return [root.realpath(p) for p in present]

class _etc_lock:
    """An exclusive flock on the root's /etc for the ld cache update.

    Two containers started at once on one root filesystem would otherwise
    both write ``/etc/ld.so.cache~`` and rename it, and race on the conf file.
    """

    def __init__(self, root: Rootfs, timeout: float):
        self._root, self._timeout, self._fd = root, timeout, -1

    def __enter__(self) -> None:
        self._fd = self._root.open("/etc")
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self._fd)
                    raise ContainerError(f"/etc in container root {self._root.path}: another "
                                         f"ld cache update held it for {self._timeout:g}s") from None
                time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # releases the lock
