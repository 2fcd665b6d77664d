"""nvct's hook chain done by the shim before the runtime starts (jit-cdi and cdi mode).

The chain's links and ld cache need nothing the runtime sets up: a link is a
name, and the cache entries come from the driver's files on the host. So the
shim runs those steps into the container's root itself, by the hook's own
executor (nvct.hooks.steps.run) through :class:`Rootfs`, and the chain hook is
left with the one step only the container's mount namespace allows (runc
refuses spec mounts under /proc): masking the driver's params, by the same
step every other path runs (one implementation: a target opened without
following links, the mask moved onto it by fd). That saves the hook's
ldconfig, imports and writes on every GPU container start. Chains of links
under /dev alone (a GPU's DRM by-path links) are the hook's too, /dev being
the runtime's tmpfs: they join the kept mask, so no start gains a hook.

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

from nvct.base.errors import ContainerError
from nvct.edits import steps as kinds
from nvct.edits.model import ContainerEdits, Mount, as_chain

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any

    from nvct.rootfs.root import Rootfs

#: The chain steps the shim can do: the params mask stays in the hook; check-requirements
#: is the shim's own check (nvct.modifier.modes); bind-mount steps become the spec's last mounts.
_EARLY = (kinds.CreateSymlinks, kinds.EnableCudaCompat, kinds.UpdateLdcache, kinds.BindMount, kinds.MaskParams,
          kinds.CheckRequirements)
#: Mounts of kernel filesystems the runtime makes: never over a library folder or /etc.
_KERNEL_MOUNTS = ("proc", "sys", "dev")


class Plan:
    """What :func:`plan` found: the chain hook to replace, its steps and the files involved.

    ``root``: the container root, opened once by :func:`plan`; :meth:`write` writes through it
    alone and closes it. ``mask``: whether this node's driver has params to mask.
    """

    def __init__(self, index: int, root: Rootfs, bundle: str, steps: list[kinds.Step],
                 host_files: dict[str, str], cache: tuple[bytes, bytes] | None, mask: bool,
                 dev_links: tuple[int, ...] = ()):
        self.index, self.root, self.rootfs, self.bundle = index, root, root.path, bundle
        self.steps, self.host_files, self.cache, self.mask = steps, host_files, cache, mask
        self.dev_links = dev_links

    def edit(self, edits: ContainerEdits) -> None:
        """The chain keeps its params mask alone (or goes); ``bind-mount`` steps become mounts, last.

        The chains of links under /dev (:func:`_dev_links_only`) join a kept mask: one hook process.
        """
        chain = as_chain(edits.hooks[self.index])
        masks = tuple(s for s in self.steps if isinstance(s, kinds.MaskParams))
        drop = {self.index}
        if self.mask and masks and chain is not None:
            links = [c for i in self.dev_links if (c := as_chain(edits.hooks[i])) is not None
                     and (c.path, c.head) == (chain.path, chain.head)]
            edits.hooks[self.index] = chain.replace(
                steps=masks[:1] + tuple(s for c in links for s in c.steps), root=self.rootfs,
                reason="the driver's params masked (ModifyDeviceFiles: 0); links and ld cache written by the shim"
                + ("; /dev links by the hook" if links else "")
                + "; on an engine's create the shim runs it after the runtime's create, no hook (Plan.after_create)")
            drop = {i for i in self.dev_links if as_chain(edits.hooks[i]) in links}
        edits.hooks[:] = [h for i, h in enumerate(edits.hooks) if i not in drop]
        for step in self.steps:
            if isinstance(step, kinds.BindMount):
                edits.mounts.append(Mount(step.host_path, step.container_path, "bind", step.options,
                                          reason="bind-mount step of the spec's hook, last"))

    def after_create(self, spec: dict[str, Any], subcommand: str | None) -> AfterCreate | None:
        """The hook :meth:`edit` left, taken out of ``spec`` for the shim to run after ``create``, or None.

        Only a ``create``: the runtime's init then waits on its exec fifo, having run no image
        code, while the shim runs the hook's steps in its mount namespace (:class:`AfterCreate`):
        one Python start fewer per GPU container. Only hooks of the params mask and /dev links,
        for this root, a mount namespace of the container's own and no user namespace (its
        mounts and files are the hook's); a ``run`` starts the process at once, so its hook
        stays. Call before :meth:`write`.
        """
        if subcommand != "create" or not isinstance(spec.get("hooks"), dict):
            return None
        linux = spec.get("linux")
        spaces = [n for n in (linux.get("namespaces") or () if isinstance(linux, dict) else ()) if isinstance(n, dict)]
        if any(n.get("type") == "user" for n in spaces) or \
                not any(n.get("type") == "mount" and not n.get("path") for n in spaces):
            return None  # a user namespace, or no mount namespace of its own (the host's, another container's)
        if not any(isinstance(m, dict) and m.get("destination") == "/proc" for m in spec.get("mounts") or ()):
            return None  # no /proc of the runtime's: nothing to mask, and the steps could not see /proc/self
        from nvct.edits.model import Hook

        hooks = spec["hooks"].get("createContainer") or []
        taken, chains = [], []
        for i, h in enumerate(hooks):
            chain = as_chain(Hook("createContainer", h.get("path"), tuple(h.get("args") or ()))) \
                if isinstance(h, dict) and isinstance(h.get("args"), list) else None
            if chain is None:
                continue
            if chain.root != self.rootfs or not all(isinstance(s, kinds.MaskParams) for s in chain.steps
                                                    if not _dev_links_only((s,))):
                return None  # a chain only the hook can run: all of nvct's stay there
            taken.append(i)
            chains.append(chain)
        if not chains:
            return None
        st = os.fstat(self.root.fileno())
        identity = next((c.identity for c in chains if c.identity), (st.st_dev, st.st_ino))
        if any(c.identity not in (None, identity) for c in chains):
            return None
        spec["hooks"]["createContainer"] = [h for i, h in enumerate(hooks) if i not in taken]
        if not spec["hooks"]["createContainer"]:
            del spec["hooks"]["createContainer"]
        from nvct.oci import spec as ocispec

        return AfterCreate(self.rootfs, identity, ocispec.root_owners(spec), [s for c in chains for s in c.steps])

    def write(self) -> None:
        """The ld cache, then the links, into the root: the hook's steps, by its executor."""
        from nvct.hooks.container import HookContext
        from nvct.hooks.steps import run

        with self.root:
            ctx = HookContext(rootfs=self.rootfs, bundle=self.bundle, root=self.root,
                              prepared=(self.host_files, self.cache))
            run([s for s in self.steps if isinstance(s, kinds.UpdateLdcache)]
                + [s for s in self.steps if isinstance(s, kinds.CreateSymlinks)], ctx)


class AfterCreate:
    """The hook's steps, run by the shim once the runtime's ``create`` has made the container.

    ``rootfs`` and ``identity``: the root as the shim verified it on the host (the hook's
    ``--container-root`` and ``--root-identity``); ``owners``: as for nvct.rootfs.root.open_root.
    """

    def __init__(self, rootfs: str, identity: tuple[int, int], owners: tuple[int, ...], steps: list[kinds.Step]):
        self.rootfs, self.identity, self.owners, self.steps = rootfs, identity, owners, steps

    def run(self, pid: int) -> None:
        """The steps in ``pid``'s mount namespace, as the hook runs them: the one executor, the root's checks.

        A forked child enters the container's mount namespace, which makes the container's
        root its own; it keeps that root open, takes back the shim's, and, where the
        container has a pid namespace of its own, enters it for its child. That child
        opens the root from the container's view (it sees itself in the container's
        /proc; ``identity``: that very directory), then runs the steps with the shim's root:
        the view a createContainer hook has before the runtime's pivot_root. The mask's rule
        (nvct.hooks.procmask.kernel_proc_path) compares a params not on procfs with the
        file this process sees at that path: the host's, never the container's own again.
        The steps' modules are imported here, once, before the forks (none while the container's
        root is the process's). Raises the step's NvctError.
        """
        from nvct.hooks import container, steps  # noqa: F401 - imported once here, not in each child
        from nvct.linux import namespaces
        from nvct.rootfs import root  # noqa: F401

        for step in self.steps:
            steps.runner(type(step))
        ns = f"/proc/{pid}/ns/pid"
        host = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        pidns = -1
        try:
            if os.stat(ns).st_ino != os.stat("/proc/self/ns/pid").st_ino:
                pidns = os.open(ns, os.O_RDONLY | os.O_CLOEXEC)
            namespaces.in_mount_namespace_of(pid, self._entered, host, pidns)
        finally:
            os.close(host)
            if pidns >= 0:
                os.close(pidns)

    def _entered(self, host: int, pidns: int) -> None:
        """In the container's mount namespace: its root kept, the shim's back, its pid namespace for the child."""
        from nvct.linux import namespaces

        container = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        _chroot(host)
        if pidns >= 0:
            import ctypes

            from nvct.base.errors import ContainerError
            from nvct.linux.libc import libc

            if libc.setns(pidns, 0x20000000):  # CLONE_NEWPID: for children only
                raise ContainerError(f"cannot enter the container's pid namespace: {os.strerror(ctypes.get_errno())}")
        return namespaces.run_in_child(None, self._steps, host, container)

    def _steps(self, host: int, container: int) -> None:
        from nvct.hooks.container import HookContext
        from nvct.hooks.steps import run
        from nvct.rootfs.root import Rootfs

        _chroot(container)
        try:
            root = Rootfs("/", owners=self.owners, same_as=self.identity)
        finally:
            _chroot(host)
        with root:
            root.path = self.rootfs  # named in messages as the hook names it
            run(self.steps, HookContext(rootfs=self.rootfs, root=root, same_as=self.identity))


def _chroot(fd: int) -> None:
    """This process's root (and working directory) set to the directory ``fd``."""
    os.fchdir(fd)
    os.chroot(".")


def plan(spec: dict[str, Any], edits: ContainerEdits, rootfs: str, bundle: str, proc_root: str) -> Plan | None:
    """A plan for doing ``edits``' chain hook now, or None to leave it to the hook. Writes nothing.

    Raises :class:`nvct.rootfs.root.UnsafeRootError` for a root nvct must not write into
    (nvct.rootfs.root.open_root): refused here, not left to the hook.
    """
    from nvct.oci import spec as ocispec
    from nvct.rootfs.root import Rootfs, UnsafeRootError

    chains = [(i, c) for i, h in enumerate(edits.hooks)
              if h.hook_name == "createContainer" and (c := as_chain(h)) is not None]
    dev_links = tuple(i for i, c in chains if _dev_links_only(c.steps))  # only the hook can: left to it
    chains = [(i, c) for i, c in chains if i not in dev_links]
    if len(chains) != 1:
        return None
    steps = _steps(chains[0][1].steps)
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
    return Plan(chains[0][0], root, os.path.abspath(bundle), steps, *checked, _to_mask(proc_root), dev_links)


def _dev_links_only(steps) -> bool:
    """A chain of links under /dev alone (DRM by-path links): /dev is the runtime's tmpfs, not yet mounted."""
    return bool(steps) and all(isinstance(s, kinds.CreateSymlinks) and s.links
                               and all(posixpath.normpath(link).startswith("/dev/") for _, link in s.links)
                               for s in steps)


def _steps(steps) -> list[kinds.Step] | None:
    """The chain's steps when the shim can do them all (the mask left to the hook), else None."""
    for step in steps:
        if type(step) not in _EARLY:
            return None  # unknown, invalid (the hook will say what is wrong), or only the hook can
        if isinstance(step, kinds.UpdateLdcache) and not step.libraries:
            return None  # another tool's spec: only ldconfig knows the entries
        if isinstance(step, kinds.BindMount) and not (step.host_path and step.container_path):
            return None
    return list(steps)


def _checked(spec: dict[str, Any], edits: ContainerEdits, root: Rootfs,
             steps: list[kinds.Step]) -> tuple[dict[str, str], tuple[bytes, bytes] | None] | None:
    """The host file of every ``--library`` and the patched cache, when nothing stands in the way."""
    from nvct.hooks.compat import compat_choice
    from nvct.hooks.ldcache import musl_arch
    from nvct.rootfs import ldconfig

    links: dict[str, str] = {}
    written: list[str] = []
    libraries: list[str] = []
    for step in steps:
        if isinstance(step, kinds.CreateSymlinks):
            for target, link in step.links:
                links[posixpath.normpath(link)] = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
                written.append(link)
        elif isinstance(step, kinds.UpdateLdcache):
            libraries += step.libraries
            written += [ldconfig.CACHE_PATH, ldconfig.CONF_PATH]
            if step.ldconfig_path:  # configured, so it must work even where unused (as in the hook)
                os.close(ldconfig.open_static_executable(ldconfig.host_ldconfig_path(step.ldconfig_path)))
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
    for step in steps:
        if isinstance(step, kinds.EnableCudaCompat) and compat_choice(root, step)[0]:
            return None  # its libraries are found by ldconfig's scan alone
    if libraries and musl_arch(root):
        return None  # musl's loader reads its path file, which the hook's update-ldcache writes
    # The engine's mounts, resolved as the runtime will; nvct's own are files and driver dirs.
    covers = [_inside(root, m["destination"]) for m in spec.get("mounts") or []
              if isinstance(m, dict) and isinstance(m.get("destination"), str)
              and posixpath.normpath("/" + m["destination"]).split("/")[1] not in _KERNEL_MOUNTS]
    covers += [posixpath.normpath(m.container_path) for m in edits.mounts]
    covers += [posixpath.normpath(s.container_path) for s in steps if isinstance(s, kinds.BindMount)]
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


def _to_mask(proc_root: str) -> bool:
    """Whether this node's driver params need the mask (no NVIDIA module: nothing to mask)."""
    from nvct.hooks.procmask import masked_params

    try:
        with open(os.path.join(proc_root, "driver/nvidia/params"), "rb") as f:
            return masked_params(f.read(1 << 20)) is not None
    except OSError:
        return False
