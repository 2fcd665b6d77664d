"""The ld cache steps: the container's ld.so.conf.d and cache, musl's path file, SONAME links."""

from __future__ import annotations

import os

from nvct.edits import steps as kinds

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from nvct.hooks.container import HookContext


def update_ldcache(step: kinds.UpdateLdcache, ctx: HookContext) -> None:
    """Add ``--folder`` dirs to the container's ld.so.conf.d and run the host's static ldconfig.

    ``--library`` (nvct's, repeated): every name in those folders ldconfig
    would enter; the cache is then patched without running it. Not with a
    CUDA compat folder, whose libraries only ldconfig's scan finds.
    """
    from nvct.rootfs import ldconfig

    folders = ctx.extra_folders + [f for f in step.folders if f not in ctx.extra_folders]
    libraries = [] if ctx.extra_folders else list(step.libraries)
    if ctx.prepared is not None:  # the shim's: the cache it planned, from the driver's files on the host
        host_files, planned = ctx.prepared
        if not ldconfig.patch_ldcache(ctx.root, folders, libraries, host_files=host_files, planned=planned):
            from nvct.base.errors import ContainerError

            raise ContainerError(f"container root {ctx.rootfs}: its ld cache changed while the "
                                 "container was being created")
        return
    ldconfig.update_ldcache(ctx.root, folders, libraries=libraries, ldconfig=step.ldconfig_path or ldconfig.DEFAULT)
    musl_path(ctx.root, folders)


#: ``uname -m`` -> musl's name for the architecture (``ld-musl-<arch>.so.1``).
_MUSL_ARCH = {"ppc64le": "powerpc64le", "arm64": "aarch64"}
#: musl's built-in search path, which a path file replaces.
_MUSL_DEFAULT = ("/lib", "/usr/local/lib", "/usr/lib")


def musl_arch(root) -> str | None:
    """musl's name for this machine when the image is musl (its ``/lib/ld-musl-<arch>.so.1``), else None."""
    machine = os.uname().machine
    arch = _MUSL_ARCH.get(machine, machine)
    return arch if root.exists(f"/lib/ld-musl-{arch}.so.1") else None


def musl_path(root, folders: list[str]) -> None:
    """On a musl image (Alpine), put ``folders`` first in ``/etc/ld-musl-<arch>.path``.

    musl's loader reads no ld cache: it searches that file's folders (separated
    by newlines or colons), else its default path, which the file then has to
    keep. The image is musl when its root has ``/lib/ld-musl-<arch>.so.1``
    (looked up through the Rootfs, as every read here).
    """
    arch = musl_arch(root)
    if not folders or arch is None:
        return
    path = f"/etc/ld-musl-{arch}.path"
    current: tuple[str, ...] = _MUSL_DEFAULT
    if root.exists(path):
        text = root.read_file(path, limit=1 << 16).decode("utf-8", "replace")
        current = tuple(p for p in text.replace(":", "\n").split() if p.startswith("/"))
    entries = [*folders, *(p for p in current if p not in folders)]
    root.write_file(path, ("\n".join(entries) + "\n").encode(), 0o644, replace=True)


def create_soname_symlinks(step: kinds.CreateSonameSymlinks, ctx: HookContext) -> None:
    """``--folder F`` (repeated): SONAME links for the libraries in those folders (``ldconfig -n``).

    The reference's hook of that name, in specs some of its releases wrote.
    """
    from nvct.rootfs import ldconfig

    ldconfig.create_soname_links(ctx.root, list(step.folders), ldconfig=step.ldconfig_path or ldconfig.DEFAULT)
