"""Which container a hook acts on, from the OCI state on stdin."""

from __future__ import annotations

import os

from nvct.base.errors import SpecError
from nvct.oci import spec as ocispec

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import IO, Any

    from nvct.rootfs.root import Rootfs


class HookContext:
    """The container's root and spec, plus what earlier steps of a chain found.

    ``root``: the root already opened (the shim's); else :attr:`root` opens it
    once, on first use, for every step. ``same_as``: the root's ``(st_dev, st_ino)``
    as verified on the host (nvct.rootfs.root.root_identity): the root opened here,
    in the container's mount namespace, must be that very directory; ``from_runtime``:
    without one, take it from the runtime's mount namespace (:func:`runtime_identity`)
    when the root is first opened. ``prepared``: the shim's (host files, planned ld
    cache) for its early update-ldcache.
    """

    def __init__(self, rootfs: str, bundle: str | None = None, pid: int | None = None,
                 spec: dict[str, Any] | None = None, root: Rootfs | None = None,
                 same_as: tuple[int, int] | None = None, prepared=None, from_runtime: bool = False):
        self.rootfs = rootfs
        self.bundle = bundle
        self.pid = pid
        self.spec = spec if spec is not None else {}
        self.extra_folders: list[str] = []
        self._root = root
        self.same_as = same_as
        self.prepared = prepared
        self.from_runtime = from_runtime

    @property
    def root(self) -> Rootfs:
        """The one verified root every step writes through (nvct.rootfs.root.open_root)."""
        if self._root is None:
            from nvct.rootfs.root import Rootfs

            owners = ocispec.root_owners(self.spec)
            if self.same_as is None and self.from_runtime:
                self.same_as = runtime_identity(self.rootfs, owners)
            self._root = Rootfs(self.rootfs, owners=owners, same_as=self.same_as)
        return self._root


def drain(stream: IO[str]) -> None:
    """Read the runtime's state to its end: crun fails a start whose hook exits before it has written it."""
    import stat

    try:
        fd = stream.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            while os.read(fd, 1 << 16):
                pass
    except (OSError, ValueError):
        pass


def read_state(stream: IO[str]) -> dict[str, Any]:
    from nvct.base import jsoncodec

    try:
        state = jsoncodec.loads(stream.read() or "null")
    except ValueError as e:
        raise SpecError(f"OCI state on stdin is not JSON: {e}") from None
    if not isinstance(state, dict):
        raise SpecError("OCI state on stdin is not a JSON object")
    return state


def from_state(stream: IO[str]) -> HookContext:
    """Find the rootfs: crun gives ``root``; runc only the bundle (``bundlePath`` when old).

    With crun's ``root``, config.json is needed for nothing but what some steps read
    from it: a hook that runs in the container's user namespace (podman ``--userns
    nomap``/``auto``, toolkit #648) may not read it (:func:`_spec_here`).
    """
    state = read_state(stream)
    bundle = state.get("bundle") or state.get("bundlePath")
    pid = state.get("pid")
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
    root = state.get("root")
    if root and isinstance(root, str):
        spec = _spec_here(bundle) if bundle else {}
        rootfs = ocispec.root_path(root, bundle or "/")
    elif bundle:
        spec = ocispec.load(bundle)
        rootfs = ocispec.rootfs(spec, bundle)
    else:
        raise SpecError("OCI state on stdin names no bundle")
    return HookContext(rootfs=rootfs, bundle=bundle, pid=pid, spec=spec, from_runtime=True)


def _spec_here(bundle: str) -> dict[str, Any]:
    """The bundle's spec, or, where this hook may not read it, only the user namespace's mappings.

    The mappings, which the root's owner check needs, are the kernel's: the hook runs in
    the container's user namespace (crun gives no pid it can see), ``/proc/self/uid_map``.
    The steps that read the container's env then see none: ``check-requirements``
    checks nothing (docs/cdi.md).
    """
    try:
        return ocispec.load(bundle)
    except SpecError:
        try:
            with open(ocispec.config_path(bundle), "rb"):
                pass
        except PermissionError:
            return {"linux": {"uidMappings": _uid_map()}}
        except OSError:
            pass
        raise


def _uid_map() -> list[dict[str, int]]:
    """This process's user namespace's ``uid_map`` as a spec's ``uidMappings``."""
    try:
        with open("/proc/self/uid_map") as f:
            rows = [line.split() for line in f]
    except OSError as e:
        raise SpecError(f"this hook's user namespace (/proc/self/uid_map): {e.strerror}") from None
    return [{"containerID": int(r[0]), "hostID": int(r[1]), "size": int(r[2])}
            for r in rows if len(r) == 3 and all(x.isdigit() for x in r)]


def runtime_identity(rootfs: str, owners) -> tuple[int, int] | None:
    """The root's identity in the runtime's mount namespace, when this hook runs in another one.

    A createContainer hook runs in the container's mount namespace, where the runtime
    may have mounted another directory over ``rootfs``'s name (it lost a race against
    the path's owner). No shim handed this hook the identity it verified, so it is
    taken here, by the one rule (nvct.rootfs.root.root_identity), from the nearest
    ancestor in another mount namespace (the runtime): this process's root is set to
    that process's root for the lookup alone. None where this hook shares the runtime's
    namespace (nothing can be mounted between the two views), cannot see it (a user
    namespace) or has no such path: the root is then opened by its name, as before. A root
    that view refuses (a symlink, another owner) is refused here too.
    """
    try:
        ours = os.stat("/proc/self/ns/mnt").st_ino
        pid = _parent("self")
        for _ in range(3):  # hook <- runc init or crun's child <- runc or crun
            if pid <= 0:
                return None
            if os.stat(f"/proc/{pid}/ns/mnt").st_ino != ours:
                break
            pid = _parent(pid)
        else:
            return None
        there = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    from nvct.base.errors import ContainerError
    from nvct.linux.fs import openat2_available
    from nvct.rootfs.root import UnsafeRootError, root_identity

    openat2_available()  # probed here: nothing is imported or loaded inside the other root
    home, cwd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), os.open(".", os.O_PATH | os.O_CLOEXEC)
    try:
        os.fchdir(there)
        try:
            os.chroot(".")
        except OSError:
            return None  # no CAP_SYS_CHROOT here: the name, as before
        try:
            return root_identity(rootfs, owners)
        except UnsafeRootError:
            raise
        except ContainerError:
            return None
        finally:
            os.fchdir(home)
            os.chroot(".")
    finally:
        os.fchdir(cwd)
        for fd in (there, home, cwd):
            os.close(fd)


def _parent(pid: int | str) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"PPid:"):
                return int(line.split()[1])
    raise ValueError(pid)


def spec_env(spec: dict) -> dict[str, str]:
    """The container's environment, from its spec's ``process.env`` (malformed entries skipped)."""
    process = spec.get("process") if isinstance(spec, dict) else None
    env = process.get("env") if isinstance(process, dict) else None
    out: dict[str, str] = {}
    for item in env if isinstance(env, list) else ():
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            out[name] = value
    return out
