"""nvct's hook chain done by the shim before the runtime starts (jit-cdi and cdi mode).

The chain's links and ld cache need nothing the runtime sets up: a link is a
name, and the cache entries come from the driver's files on the host. So the
shim writes them into the container's root itself, through :class:`Rootfs`
exactly as the hook would, and the createContainer hook is left with the one
step only the container's mount namespace allows (runc refuses spec mounts
under /proc): masking the driver's params, a short sh script. That saves
the hook's Python start, about 15 ms of every GPU container start.

Whatever this cannot do exactly leaves the chain to the hook, unchanged: a
step other than those below, a spec mount (a volume) over a path the chain
writes, an image whose CUDA compat libcuda is newer than the driver, an ld
cache only ldconfig can update. ``nvct explain --bundle`` shows the spec the
shim would write (planned, nothing written); the debug log says which way a
start went.
"""

from __future__ import annotations

import os
import posixpath

from nvct.edits.model import HOOK_ENV, ContainerEdits, Hook, Mount
from nvct.base.errors import ContainerError, NvctError

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

    from nvct.rootfs.root import Rootfs

#: The chain steps the shim can do (the params step becomes the sh hook).
_STEPS = {"create-symlinks", "enable-cuda-compat", "update-ldcache", "bind-mount",
          "disable-device-node-modification", "update-nvidia-params",
          "check-requirements"}  # the shim's cdi mode checked them before (nvct.modifier.modes)
#: Mounts of kernel filesystems the runtime makes: never over a library folder or /etc.
_KERNEL_MOUNTS = ("proc", "sys", "dev")
#: The masked params, beside config.json: the engine removes the bundle with the container.
PARAMS_FILE = "nvct-driver-params"
#: $1: the container's root; $2: the masked params. The runtime's state on stdin is read
#: first: crun fails the start when a hook exits before it has written it. Then the rule of
#: nvct.hooks.steps.kernel_proc_path, in sh: the shell's working directory is the root's
#: /proc, entered and checked (``$PWD``) to be reached without a link, so nothing below is
#: looked up by the root's name again; driver, nvidia and params are no links, and params is
#: on procfs (or is this process's own /proc file: a simulated node). ``mount -c`` hands the
#: relative target to the kernel as it is. A volume there was refused by the shim already.
MASK_SCRIPT = ('while IFS= read -r line; do :; done\n'
               'r=${1%/}; m=$2; p=driver/nvidia/params\n'
               'no() { echo "nvct: $r/proc$1; not masking the driver params" >&2; exit 1; }\n'
               'cd -P -- "$r/proc" 2>/dev/null || exit 0\n'
               '[ "$PWD" = "$r/proc" ] || no ": reached through a symlink"\n'
               'for q in driver driver/nvidia $p; do [ -L $q ] && no "/$q: a symlink"; done\n'
               '[ -e $p ] || exit 0\n'
               '[ "$(stat -f -c %t $p)" = 9fa0 ] || { set -- $(stat -c %d:%i $p /proc/$p 2>/dev/null); '
               '[ $# = 2 ] && [ "$1" = "$2" ]; } || no "/$p: not on the kernel\'s procfs"\n'
               'exec mount -c --bind -o ro "$m" $p\n')


class Plan:
    """What :func:`plan` found: the chain hook to replace, its steps' arguments and the files involved.

    ``root``: the container root, opened once by :func:`plan`; :meth:`write` writes through it
    alone and closes it.
    """

    def __init__(self, index: int, root: Rootfs, bundle: str, steps: list[tuple[str, Any]],
                 host_files: dict[str, str], cache: tuple[bytes, bytes] | None, params: bytes | None):
        self.index, self.root, self.rootfs, self.bundle = index, root, root.path, bundle
        self.steps, self.host_files, self.cache, self.params = steps, host_files, cache, params

    def edit(self, edits: ContainerEdits) -> None:
        """The chain hook becomes the params mask (or goes); ``bind-mount`` steps become mounts, last."""
        hook = edits.hooks.pop(self.index)
        if self.params is not None:
            path = os.path.join(self.bundle, PARAMS_FILE)
            edits.hooks.insert(self.index, Hook(
                "createContainer", "/bin/sh", ("sh", "-c", MASK_SCRIPT, "nvct-mask-params", self.rootfs, path),
                hook.env or HOOK_ENV, reason="the driver's params masked (ModifyDeviceFiles: 0); links and ld cache "
                                 "written by the shim"))
        for name, args in self.steps:
            if name == "bind-mount":
                edits.mounts.append(Mount(args.one("host-path"), args.one("container-path"), "bind",
                                          tuple((args.one("options") or "").split(",")),
                                          reason="bind-mount step of the spec's hook, last"))

    def write(self) -> None:
        """The masked params into the bundle, then cache and links in the root, as the hook's steps would.

        The bundle first: a full bundle fails before the root is touched.
        """
        from nvct.rootfs import ldconfig

        if self.params is not None:
            from nvct.base import fileutil

            path = os.path.join(self.bundle, PARAMS_FILE)
            try:
                fileutil.write_atomic(path, self.params, mode=0o444, durable=False)
            except OSError as e:
                self.root.close()
                raise ContainerError(f"{path}: cannot write the masked driver params: {e.strerror or e}") from None
        from nvct.hooks.container import HookContext
        from nvct.hooks.steps import create_symlinks

        with self.root:
            for name, args in self.steps:
                if name == "update-ldcache" and not ldconfig.patch_ldcache(
                        self.root, args.all("folder"), args.all("library"), host_files=self.host_files,
                        planned=self.cache):
                    raise ContainerError(f"container root {self.rootfs}: its ld cache changed while the "
                                         "container was being created")
            ctx = HookContext(rootfs=self.rootfs, bundle=self.bundle, root=self.root)
            for name, args in self.steps:
                if name == "create-symlinks":
                    create_symlinks(args, ctx)


def plan(spec: dict[str, Any], edits: ContainerEdits, rootfs: str, bundle: str, proc_root: str) -> Plan | None:
    """A plan for doing ``edits``' chain hook now, or None to leave it to the hook. Writes nothing.

    Raises :class:`nvct.rootfs.root.UnsafeRootError` for a root nvct must not write into
    (nvct.rootfs.root.open_root): refused here, not left to the hook.
    """
    from nvct.oci import spec as ocispec
    from nvct.edits.build import chain_steps
    from nvct.rootfs.root import Rootfs, UnsafeRootError

    chains = [i for i, h in enumerate(edits.hooks)
              if h.hook_name == "createContainer" and chain_steps(list(h.args)) is not None]
    if len(chains) != 1:
        return None
    steps = _steps(chain_steps(list(edits.hooks[chains[0]].args)))
    if steps is None:
        return None
    try:
        root = Rootfs(rootfs, owners=ocispec.root_owners(spec))
    except UnsafeRootError:
        raise
    except ContainerError:
        return None  # missing, ...: the runtime says so
    try:
        checked = _checked(spec, edits, root, steps)
    except ContainerError:
        checked = None  # the hook will say what is wrong, as it did before
    if checked is None:
        root.close()
        return None
    from nvct.hooks.steps import PARAMS_STEPS

    params = None
    if any(name in PARAMS_STEPS for name, _ in steps):
        params = _masked_params(proc_root)
    return Plan(chains[0], root, os.path.abspath(bundle), steps, *checked, params)


def _steps(chain: list[str]) -> list[tuple[str, Any]] | None:
    from nvct.hooks.steps import _Args, _split

    if chain[:1] == ["--container-root"]:
        chain = chain[2:]
    out = []
    for step in _split(chain):
        if step[0] not in _STEPS:
            return None
        try:
            args = _Args(step[0], step[1:])
        except NvctError:
            return None  # the hook will say what is wrong
        if step[0] == "update-ldcache" and not args.all("library"):
            return None  # another tool's spec: only ldconfig knows the entries
        if step[0] == "bind-mount" and not (args.one("host-path") and args.one("container-path")):
            return None
        out.append((step[0], args))
    return out


def _checked(spec: dict[str, Any], edits: ContainerEdits, root: Rootfs,
             steps: list[tuple[str, Any]]) -> tuple[dict[str, str], tuple[bytes, bytes] | None] | None:
    """The host file of every ``--library`` and the patched cache, when nothing stands in the way."""
    from nvct.rootfs import ldconfig
    from nvct.hooks.steps import compat_choice, musl_arch

    links: dict[str, str] = {}
    written: list[str] = []
    libraries: list[str] = []
    for name, args in steps:
        if name == "create-symlinks":
            for pair in args.all("link"):
                target, _, link = pair.partition("::")
                links[posixpath.normpath(link)] = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
                written.append(link)
        elif name == "update-ldcache":
            libraries += args.all("library")
            written += [ldconfig.CACHE_PATH, ldconfig.CONF_PATH]
            if args.one("ldconfig-path"):  # configured, so it must work even where unused (as in the hook)
                os.close(ldconfig.open_static_executable(ldconfig.host_ldconfig_path(args.one("ldconfig-path"))))
    mounted = {posixpath.normpath(m.container_path): m.host_path for m in edits.mounts}
    host_files = {}
    for library in libraries:
        path = posixpath.normpath(library)
        for _ in range(8):  # a link to a link to the mounted file, at most
            if path in mounted or path not in links:
                break
            path = links[path]
        if path not in mounted:
            return None
        host_files[library] = mounted[path]
    for name, args in steps:
        if name == "enable-cuda-compat" and compat_choice(root, args)[0]:
            return None  # its libraries are found by ldconfig's scan alone
    if libraries and musl_arch(root):
        return None  # musl's loader reads its path file, which the hook's update-ldcache writes
    # The engine's mounts, resolved as the runtime will; nvct's own are files and driver dirs.
    covers = [_inside(root, m["destination"]) for m in spec.get("mounts") or []
              if isinstance(m, dict) and isinstance(m.get("destination"), str)
              and posixpath.normpath("/" + m["destination"]).split("/")[1] not in _KERNEL_MOUNTS]
    covers += [posixpath.normpath(m.container_path) for m in edits.mounts]
    covers += [posixpath.normpath(args.one("container-path")) for name, args in steps if name == "bind-mount"]
    folders: dict[str, str] = {}
    for path in written:  # its folder resolved: a link there is replaced, never followed
        folder, name = posixpath.split(posixpath.normpath("/" + path))
        if folder not in folders:
            folders[folder] = _inside(root, folder)
        real = posixpath.join(folders[folder], name)
        if any(real == c or real.startswith(c.rstrip("/") + "/") for c in covers):
            return None  # a volume over it: what is written now would be hidden
    cache = ldconfig.patched_cache(root, libraries, host_files) if libraries else None
    if libraries and cache is None:
        return None  # only ldconfig can: no cache, the old format, ...
    return host_files, cache


def _inside(root, path: str) -> str:
    """``path`` resolved in the root as far as it exists (as the runtime resolves mount targets)."""
    path = posixpath.normpath("/" + path)
    head, tail = path, ""
    while head != "/":
        try:
            return posixpath.join(root.realpath(head), tail) if tail else root.realpath(head)
        except ContainerError:
            head, name = posixpath.split(head)
            tail = posixpath.join(name, tail) if tail else name
    return path


def _masked_params(proc_root: str) -> bytes | None:
    from nvct.hooks.steps import masked_params

    try:
        with open(os.path.join(proc_root, "driver/nvidia/params"), "rb") as f:
            return masked_params(f.read(1 << 20))
    except OSError:
        return None  # no NVIDIA module: the container's /proc has nothing to mask either
