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

import ctypes
import fcntl
import os
import select
import stat
import struct
import sys
import time

from nvct.linux import privileges
from nvct.base.errors import CacheError, ContainerError
from nvct.linux.namespaces import mounts, unshare_mount_namespace
from nvct.linux.fs import MNT_DETACH, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REMOUNT, UMOUNT_NOFOLLOW, mount, open_no_symlinks, umount
from nvct.rootfs.root import Rootfs
from nvct.linux.libc import libc as _libc

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence

CONF_PATH = "/etc/ld.so.conf.d/00-nvct-driver.conf"
CACHE_PATH = "/etc/ld.so.cache"
DEFAULT = "@/sbin/ldconfig"  # the config's default: the host's /sbin/ldconfig

# ldconfig writes files and symlinks owned by whoever owns the image's dirs.
_KEEP_CAPS = {"dac_override", "dac_read_search", "fowner"}
# Mounts whose files act on the host kernel or lead out of a chroot.
_DETACH_FSTYPES = {"proc", "sysfs", "cgroup", "cgroup2", "securityfs", "debugfs",
                   "tracefs", "bpf", "efivarfs", "nsfs", "binfmt_misc", "fusectl",
                   "configfs", "pstore"}
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_SETUP_FAILED = 126  # the child's exit status when it failed before exec
_PT_INTERP = 3
_ET_DYN, _EM_386 = 3, 3
_SIGKILL = 9
_OUTPUT_LIMIT = 64 * 1024



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
    """
    path = value[1:] if value.startswith("@") else value
    if not path.startswith("/"):
        raise ContainerError(f"ldconfig {value!r}: must be an absolute host path "
                             "(e.g. '@/sbin/ldconfig')")
    return path


def open_static_executable(path: str) -> int:
    """An O_RDONLY fd on ``path`` after checking it is a static ELF executable.

    A dynamic ldconfig would, once chrooted, load its libc from the image.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise ContainerError(f"ldconfig {path}: {e.strerror}") from None
    try:
        problem = _static_elf_problem(fd)
        if problem:
            raise ContainerError(f"ldconfig {path}: {problem}")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _static_elf_problem(fd: int) -> str | None:
    head = os.pread(fd, 64, 0)
    if len(head) < 52 or head[:4] != b"\x7fELF":
        return ("not an ELF executable (a wrapper script? on Ubuntu use "
                "'@/sbin/ldconfig.real')")
    if head[4] not in (1, 2) or head[5] not in (1, 2):
        return "malformed ELF header"
    end = "<" if head[5] == 1 else ">"
    if head[4] == 2:
        if len(head) < 64:
            return "malformed ELF header"
        e_type, = struct.unpack_from(end + "H", head, 16)
        phoff, = struct.unpack_from(end + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
    else:
        e_type, = struct.unpack_from(end + "H", head, 16)
        phoff, = struct.unpack_from(end + "I", head, 28)
        phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
    if e_type not in (2, 3) or phentsize < 4 or phnum == 0 or phnum > 4096:
        return "not an ELF executable"
    table = os.pread(fd, phentsize * phnum, phoff)
    if len(table) < phentsize * phnum:
        return "truncated ELF program headers"
    for i in range(phnum):
        p_type, = struct.unpack_from(end + "I", table, i * phentsize)
        if p_type == _PT_INTERP:
            return ("dynamically linked; a static ldconfig is required (it runs "
                    "chrooted in the container, whose libraries must not be loaded)")
    return None


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
                check_conf(root)
                return _run_chrooted(root, exe, ["ldconfig", "-C", CACHE_PATH, *folders],
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
        self._own = None if isinstance(root, Rootfs) else Rootfs(root)
        self._root = root if self._own is None else self._own

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
    """The root's ld cache and that cache with ``libraries`` added as ldconfig would; None where only ldconfig can.

    Each path becomes the entry ldconfig makes for it: its basename and the
    flags ldconfig gives it (:func:`_library_entry`; the file is read in the
    root, or on the host through ``host_files``). The image's cache must be
    one glibc >= 2.32 wrote and :func:`nvct.discover.ldcache.add` can patch exactly
    (the loader's own search finding every new entry afterwards, and every
    old one as before); anything else (no cache, the old format, a cache
    glibc may read otherwise once patched, a path that is not an x86-64,
    aarch64 or i386 ELF library) is left to ldconfig, which writes the whole cache
    afresh; a debug line says why. Reads only through the root, runs nothing.
    Skipping ldconfig also skips its rescan of the image's folders: entries
    the image's cache lacks stay missing, as they were before the start.
    """
    from nvct.discover import ldcache

    if not root.exists(CACHE_PATH):
        return None
    try:
        data = root.read_file(CACHE_PATH, limit=ldcache._MAX_FILE_SIZE + 1)
        entries = []
        for path in libraries:
            if host_files is not None:
                fd = _open_host_file(host_files.get(path))
            else:
                fd = root.open(path)
            found = _library_entry(fd, path) if fd >= 0 else None
            if found is None:
                return None
            entries.append(found)
        return data, ldcache.add(data, entries, source=CACHE_PATH)
    except CacheError as e:
        from nvct.base.log import logger

        logger.debug("%s: left to ldconfig", e)
        return None
    except ContainerError:
        return None


def _open_host_file(path: str | None) -> int:
    """An fd on a host file (the driver's; trusted like every host path nvct mounts), else -1."""
    if path is None:
        return -1
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return -1


#: e_machine of a little-endian 64-bit library -> the flags its architecture's ldconfig gives every one:
#: FLAG_ELF_LIBC6 | FLAG_X8664_LIB64 (x86-64: "libc6,x86-64"), | FLAG_AARCH64_LIB64 (arm64: "libc6,AArch64").
_FLAGS_64 = {62: 0x0303, 183: 0x0A03}
_FLAGS_LIBC6 = 0x0003  # FLAG_ELF_LIBC6: an i386 library that needs libc.so.6
_PT_LOAD, _PT_DYNAMIC, _DT_NEEDED, _DT_STRTAB, _DT_STRSZ = 1, 2, 1, 5, 10


def _library_entry(fd: int, path: str):
    """The cache entry ldconfig (glibc >= 2.33: no OS version) makes for the library open on ``fd``.

    x86-64 and aarch64 libraries always get their architecture's flags; an
    i386 one gets libc6's when it needs ``libc.so.6`` (every driver library
    does). Anything else: None.
    Closes ``fd``.
    """
    from nvct.discover import ldcache

    try:
        head = os.pread(fd, 64, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        if len(head) == 64 and head[:6] == b"\x7fELF\x02\x01" and struct.unpack_from("<H", head, 16)[0] == _ET_DYN \
                and struct.unpack_from("<H", head, 18)[0] in _FLAGS_64:
            flags = _FLAGS_64[struct.unpack_from("<H", head, 18)[0]]
        elif len(head) >= 52 and head[:6] == b"\x7fELF\x01\x01" \
                and struct.unpack_from("<HH", head, 16) == (_ET_DYN, _EM_386) and b"libc.so.6" in _needed32(fd, head):
            flags = _FLAGS_LIBC6
        else:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    return ldcache.Entry(path.rsplit("/", 1)[1], path, flags)


def _needed32(fd: int, head: bytes) -> list[bytes]:
    """``DT_NEEDED`` of a little-endian 32-bit ELF, read from its program headers (bounded)."""
    phoff, = struct.unpack_from("<I", head, 28)
    phentsize, phnum = struct.unpack_from("<HH", head, 42)
    if phentsize < 32 or phnum > 256:
        return []
    table = os.pread(fd, phentsize * phnum, phoff)
    loads, dynamic = [], None
    for i in range(len(table) // phentsize):
        p_type, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<5I", table, i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    data = os.pread(fd, min(dynamic[1], 1 << 16), dynamic[0])
    needed, strtab, strsz = [], None, 1 << 16
    for tag, value in struct.iter_unpack("<iI", data[:len(data) // 8 * 8]):
        if tag == 0:
            break
        if tag == _DT_NEEDED:
            needed.append(value)
        elif tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_STRSZ:
            strsz = min(value, 1 << 16)
    base = next((offset + strtab - vaddr for vaddr, offset, size in loads
                 if strtab is not None and vaddr <= strtab < vaddr + size), None)
    if base is None:
        return []
    strings = os.pread(fd, strsz, base)
    return [strings[at:strings.find(b"\0", at)] for at in needed if strings.find(b"\0", at) >= 0]


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
            return _run_chrooted(root, exe, ["ldconfig", "-n", *folders], timeout, ldconfig, writable)
    finally:
        os.close(exe)


def _writable(root: Rootfs, paths: Sequence[str]) -> list[str]:
    """Where ldconfig may write (the cache's /etc, the folders' links), checked onto the mount
    each path names; every other mount under the root it only reads (_freeze_other_mounts)."""
    present = [p for p in paths if root.exists(p)]
    for path in present:
        root.check_same_mount(path)
    return [root.realpath(p) for p in present]


_MAX_CONF_FILES = 512


def check_conf(root: Rootfs, path: str = "/etc/ld.so.conf") -> None:
    """Follow the image's ld.so.conf and its ``include`` lines as ldconfig will, first.

    ldconfig blocks forever on a FIFO and recurses without end on a file
    that includes itself; both would hold the container's start until the
    time limit. Here they fail at once with one line. Every file must be a
    regular file (Rootfs.open refuses anything else) and no include chain
    may come back to a file it passed.
    """
    count = [0]

    def visit(conf: str, chain: tuple[str, ...]) -> None:
        real = root.realpath(conf)
        if real in chain:
            raise ContainerError(f"{conf} in container root {root.path}: ld.so.conf includes "
                                 "itself; refusing to run ldconfig on it")
        count[0] += 1
        if count[0] > _MAX_CONF_FILES:
            raise ContainerError(f"{path} in container root {root.path}: includes more than "
                                 f"{_MAX_CONF_FILES} files; refusing to run ldconfig on it")
        text = root.read_file(conf).decode("utf-8", "replace")
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("include") or line[7:8] not in (" ", "\t"):
                continue
            for pattern in line[8:].split():
                if not pattern.startswith("/"):
                    pattern = os.path.join(os.path.dirname(real), pattern)
                for found in _glob(root, pattern):
                    visit(found, chain + (real,))

    if root.exists(path):
        visit(path, ())


def _glob(root: Rootfs, pattern: str) -> list[str]:
    """glob(3) inside the root, sorted as ldconfig sees it; directories are skipped."""
    paths = ["/"]
    parts = [p for p in pattern.split("/") if p]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt = []
        for base in paths:
            if not any(c in part for c in "*?["):
                nxt.append(_join(base, part))
                continue
            try:
                names = root.listdir(base)
            except ContainerError:
                continue
            nxt.extend(_join(base, n) for n in sorted(names) if _match(n, part)
                       and (not n.startswith(".") or part.startswith(".")))
        paths = nxt
        if not last:
            paths = [p for p in paths if root.exists(p)]
    return [p for p in paths if root.exists(p) and not _is_dir(root, p)]


def _match(name: str, pattern: str) -> bool:
    """fnmatch without importing re (this runs on every container start)."""
    if "[" in pattern:
        import fnmatch

        return fnmatch.fnmatchcase(name, pattern)
    # Greedy wildcard matching with one backtrack point: linear for '*' and '?'.
    n = p = 0
    star, mark = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] in ("?", name[n]):
            n, p = n + 1, p + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, mark, p = p, n, p + 1
        elif star >= 0:
            mark += 1
            n, p = mark, star + 1
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _is_dir(root: Rootfs, path: str) -> bool:
    try:
        root.listdir(path)
        return True
    except ContainerError:
        return False


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


def _run_chrooted(root: Rootfs, exe: int, argv: list[str], timeout: float,
                  name: str, writable: Sequence[str] = ("/",)) -> str:
    root_real = os.readlink(f"/proc/self/fd/{root.fileno()}")
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
        if pid == 0:
            _child(root.fileno(), root_real, exe, argv, devnull, out_w, writable)
        os.close(out_w)
        out_w = -1
        output, status = _collect(pid, out_r, timeout)
    finally:
        os.close(devnull)
        os.close(out_r)
        if out_w >= 0:
            os.close(out_w)
    text = output.decode("utf-8", "replace")
    if status is None:
        raise ContainerError(f"ldconfig {name} in container root {root.path}: "
                             f"killed after {timeout:g}s")
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return text
    last = _last_line(text)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _SETUP_FAILED \
            and last.startswith("nvct: "):
        raise ContainerError(f"ldconfig in container root {root.path}: {last[6:]}")
    how = (f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status)
           else f"signal {os.WTERMSIG(status)}")
    raise ContainerError(f"ldconfig {name} failed in container root {root.path} "
                         f"({how}): {last or 'no output'}")


def _child(root_fd: int, root_real: str, exe: int, argv: list[str], devnull: int,
           out_w: int, writable: Sequence[str] = ("/",)) -> None:
    """Never returns: execs ldconfig or exits with _SETUP_FAILED."""
    try:
        _no_more_imports()  # every path below the chroot is the image's
        exe, devnull, out_w = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                               for fd in (exe, devnull, out_w))
        unshare_mount_namespace()
        if _libc.unshare(_CLONE_NEWNET | _CLONE_NEWIPC):
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(net, ipc): {os.strerror(err)}")
        _detach_pseudo_mounts(root_real)
        _freeze_other_mounts(root_real, writable)
        # root_fd still points into the caller's namespace, where procfs is
        # mounted: chroot into this namespace's copy of the root instead (no link followed).
        new_root = open_no_symlinks(root_real)
        old, new = os.fstat(root_fd), os.fstat(new_root)
        if (old.st_dev, old.st_ino) != (new.st_dev, new.st_ino):
            raise ContainerError(f"container root {root_real} changed under us")
        os.fchdir(new_root)
        os.chroot(".")
        os.chdir("/")
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.closerange(3, exe)
        os.closerange(exe + 1, os.sysconf("SC_OPEN_MAX"))
        privileges.drop_capabilities(_KEEP_CAPS)
        privileges.set_no_new_privs()
        os.execve(exe, argv, privileges.minimal_env())
    except BaseException as e:  # noqa: BLE001 - report, never return to the caller
        msg = f"nvct: {e.strerror if isinstance(e, OSError) and e.strerror else e}"
        for fd in (out_w, 2):  # out_w is closed once stdout/stderr are the pipe
            try:
                os.write(fd, (" ".join(msg.split()) + "\n").encode())
                break
            except BaseException:  # noqa: BLE001
                continue
    os._exit(_SETUP_FAILED)


def _no_more_imports() -> None:
    """From here on only modules already loaded (or built in) can be imported: inside
    the container root an import would find the image's file and run it as root."""
    sys.path[:] = []
    sys.path_importer_cache.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") in ("BuiltinImporter",
                                                                                   "FrozenImporter")]


def _detach_pseudo_mounts(root_real: str) -> None:
    """Detach procfs & co. under the root (in our private mount namespace).

    Fails closed: if any is still there afterwards, ldconfig does not run.
    """
    prefix = root_real.rstrip("/") + "/"

    def under_root() -> list[str]:
        return [m.mount_point for m in mounts()
                if m.fstype in _DETACH_FSTYPES
                and (m.mount_point == root_real or m.mount_point.startswith(prefix))]

    for point in sorted(under_root(), key=len, reverse=True):
        try:
            umount(point, MNT_DETACH | UMOUNT_NOFOLLOW)
        except OSError:
            pass  # gone with a parent already; checked below
    left = under_root()
    if left:
        raise ContainerError(f"cannot detach {left[0]} before running ldconfig")


def _freeze_other_mounts(root_real: str, writable: Sequence[str]) -> None:
    """Make the mounts under the root read-only (in our private namespace) but the written ones.

    ldconfig makes SONAME links in every folder it scans, including folders
    the image's own ld.so.conf lists, such as the read-write host directory
    ``/tmp/nvidia-mps`` or a volume. Only the mounts holding ``writable``
    (paths inside the root: /etc and the folders nvct checked) stay
    writable. Fails closed: a mount that cannot be frozen stops ldconfig.
    """
    top = root_real.rstrip("/")
    points = list(dict.fromkeys(m.mount_point for m in mounts()
                                if m.mount_point.startswith(top + "/")))

    def holder(path: str) -> str:
        return max((p for p in [root_real, *points] if path == p or path.startswith(p.rstrip("/") + "/")),
                   key=len)

    keep = {holder(top + (w if w != "/" else "")) for w in writable}
    for point in points:
        if point in keep:
            continue
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # covered by a later mount, or gone with a detached parent
        if flags & os.ST_RDONLY:
            continue
        keep_flags = ((MS_NOSUID if flags & os.ST_NOSUID else 0) | (MS_NODEV if flags & os.ST_NODEV else 0)
                      | (MS_NOEXEC if flags & os.ST_NOEXEC else 0))
        try:
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep_flags)
        except OSError as e:
            raise ContainerError(f"cannot make {point} read-only before running ldconfig: "
                                 f"{e.strerror}") from None


def _collect(pid: int, fd: int, timeout: float) -> tuple[bytes, int | None]:
    """Child's output (the last 64 KiB) and wait status; None status on timeout."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, _SIGKILL)
            os.waitpid(pid, 0)
            return bytes(buf), None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        del buf[:-_OUTPUT_LIMIT]
    try:  # output closed: the child exits now; wait on a pidfd rather than polling
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return bytes(buf), status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, _SIGKILL)
                os.waitpid(pid, 0)
                return bytes(buf), None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(0.0005)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else "?" for c in lines[-1])
    return line[:300]
