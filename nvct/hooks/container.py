"""Which container a hook acts on, from the OCI state on stdin."""

from __future__ import annotations

from nvct.oci import spec as ocispec
from nvct.base.errors import SpecError

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import IO, Any

    from nvct.rootfs.root import Rootfs


class HookContext:
    """The container's root and spec, plus what earlier steps of a chain found.

    ``root``: the root already opened (the shim's); else :attr:`root` opens it
    once, on first use, for every step.
    """

    def __init__(self, rootfs: str, bundle: str | None = None, pid: int | None = None,
                 spec: dict[str, Any] | None = None, root: Rootfs | None = None):
        self.rootfs = rootfs
        self.bundle = bundle
        self.pid = pid
        self.spec = spec if spec is not None else {}
        self.extra_folders: list[str] = []
        self._root = root

    @property
    def root(self) -> Rootfs:
        """The one verified root every step writes through (nvct.rootfs.root.open_root)."""
        if self._root is None:
            from nvct.rootfs.root import Rootfs

            self._root = Rootfs(self.rootfs, owners=ocispec.root_owners(self.spec))
        return self._root


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
    """Find the rootfs: crun gives ``root``; runc only the bundle (``bundlePath`` when old)."""
    state = read_state(stream)
    bundle = state.get("bundle") or state.get("bundlePath")
    spec: dict[str, Any] = {}
    if bundle:
        spec = ocispec.load(bundle)
    root = state.get("root")
    if root and isinstance(root, str):
        rootfs = ocispec.root_path(root, bundle or "/")
    elif bundle:
        rootfs = ocispec.rootfs(spec, bundle)
    else:
        raise SpecError("OCI state on stdin names no bundle")
    pid = state.get("pid")
    return HookContext(rootfs=rootfs, bundle=bundle, pid=pid if isinstance(pid, int) else None, spec=spec)
