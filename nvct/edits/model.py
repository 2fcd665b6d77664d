"""What goes into a container, in the shape of CDI's containerEdits.

Every realization (spec edits in the shim, work done by the hook inside the
container, a CDI spec on disk) is computed from this one model, so the three
can never disagree about what a container gets.

``reason`` fields say why an edit is there (which capability, which GPU); they
are for ``nvct explain`` and take no part in comparison or serialization.
"""

from __future__ import annotations

from nvct.base.record import Record

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Any, Iterable, Sequence

#: OCI hook stages that CDI allows.
HOOK_STAGES = (
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)


class DeviceNode(Record):
    """A device node to create in the container (and allow in its cgroup)."""

    __slots__ = ("path", "major", "minor", "type", "host_path", "file_mode", "uid", "gid",
                 "permissions", "reason")
    _defaults = {"type": "c", "host_path": None, "file_mode": None, "uid": None, "gid": None,
                 "permissions": "", "reason": ""}
    path: str
    major: int
    minor: int
    type: str
    host_path: str | None
    file_mode: int | None
    uid: int | None
    gid: int | None
    #: cgroup access ("r", "w", "m" letters, or "none"); empty means CDI's default "rwm".
    permissions: str
    reason: str

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        out["type"] = self.type
        out["major"] = self.major
        out["minor"] = self.minor
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        if self.permissions:
            out["permissions"] = self.permissions
        if self.uid is not None:
            out["uid"] = self.uid
        if self.gid is not None:
            out["gid"] = self.gid
        return out


class Mount(Record):
    """A bind (or other) mount from the host into the container."""

    __slots__ = ("host_path", "container_path", "type", "options", "reason")
    _defaults = {"type": None, "options": (), "reason": ""}
    host_path: str
    container_path: str
    type: str | None
    options: tuple[str, ...]
    reason: str

    @property
    def writable(self) -> bool:
        """Whether the container may write through it (no ``ro`` option)."""
        return "ro" not in self.options

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
        }
        if self.type:
            out["type"] = self.type
        if self.options:
            out["options"] = list(self.options)
        return out


#: PATH of every hook nvct writes: the system directories, nothing from a container.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The sealed environment of every hook nvct writes (jit-cdi, CDI specs, legacy, hooks.d,
#: the toolkit's). A hook without ``env`` runs with its runtime's environment, and runc
#: gives a createContainer hook the *container's*, cwd its rootfs (CVE-2025-23266). An
#: empty list seals it under runc and crun, but Go's ``omitempty`` drops it on the way
#: through podman and containerd, so the list is never empty. See docs/security.md.
HOOK_ENV = ("PATH=" + HOOK_PATH,)


def hook_env(*extra: str, first: Sequence[str] = ()) -> tuple[str, ...]:
    """:data:`HOOK_ENV` plus ``NAME=value`` entries that nvct itself sets (never a container);
    ``first``: folders PATH starts with (the engine's own, never a container's)."""
    if not first:
        return HOOK_ENV + tuple(extra)
    return ("PATH=" + ":".join([*first, HOOK_PATH]), *extra)


def is_sealed(hook: dict[str, Any]) -> bool:
    """Whether a spec's hook entry (CDI or OCI shape) fixes its own environment."""
    return bool(hook.get("env"))


class Hook(Record):
    """An OCI hook: ``path`` is executed with exactly ``args`` and ``env``.

    ``env`` defaults to :data:`HOOK_ENV`: a hook nvct writes is always sealed.
    """

    __slots__ = ("hook_name", "path", "args", "env", "timeout", "reason")
    _defaults = {"args": (), "env": HOOK_ENV, "timeout": None, "reason": ""}
    hook_name: str
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...]
    timeout: int | None
    reason: str

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


class Chain(Record):
    """nvct's hook chain: typed steps (nvct.edits.steps) run in one hook process.

    ``head``: the program's part of the argv (``nvct hook chain``, ``nvidia-cdi-hook chain``);
    ``root`` and ``identity``: the container root and its ``(st_dev, st_ino)`` as the shim
    verified them on the host, so the hook writes into that very directory. The hook's
    arguments (:attr:`args`) exist only for a spec being written.
    """

    __slots__ = ("hook_name", "path", "head", "steps", "root", "identity", "env", "timeout", "reason")
    _defaults = {"root": None, "identity": None, "env": HOOK_ENV, "timeout": None, "reason": ""}
    hook_name: str
    path: str
    head: tuple[str, ...]
    steps: tuple[Any, ...]
    root: str | None
    identity: tuple[int, int] | None
    env: tuple[str, ...]
    timeout: int | None
    reason: str

    @property
    def args(self) -> tuple[str, ...]:
        from nvct.edits import steps

        return (*self.head, *steps.options_argv(self.root, self.identity), *steps.to_argv(self.steps))

    def replace(self, **changes):
        """A copy with ``changes``; new ``args`` are parsed (a plain :class:`Hook` when they are no chain)."""
        args = changes.pop("args", None)
        values = {f: getattr(self, f) for f in self.__slots__}
        values.update(changes)
        new = Chain(**values)
        if args is None:
            return new
        return as_chain(Hook(new.hook_name, new.path, tuple(args), new.env, new.timeout, new.reason)) or \
            Hook(new.hook_name, new.path, tuple(args), new.env, new.timeout, new.reason)

    def to_cdi(self) -> dict[str, Any]:
        return Hook(self.hook_name, self.path, self.args, self.env, self.timeout).to_cdi()


def join_chains(hooks: list) -> list:
    """nvct's createContainer chains that follow one another and one hook process can run in turn
    (the same program, argv head, root and environment) joined into the first: a start pays one
    hook process, not one per chain (a CDI device's links after the spec's common chain)."""
    out: list = []
    last = None  # the index in out of the last createContainer hook
    for hook in hooks:
        if hook.hook_name != "createContainer":
            out.append(hook)
            continue
        chain = as_chain(hook)
        prev = as_chain(out[last]) if last is not None else None
        if chain is not None and prev is not None and _joinable(prev, chain):
            out[last] = prev.replace(steps=(*prev.steps, *chain.steps), reason="; ".join(
                r for r in (prev.reason, chain.reason) if r))
            continue
        last = len(out)
        out.append(hook)
    return out


def _joinable(a: Chain, b: Chain) -> bool:
    return (a.path, a.head, a.root, a.identity, tuple(a.env), a.timeout) == \
        (b.path, b.head, b.root, b.identity, tuple(b.env), b.timeout)


def as_chain(hook) -> Chain | None:
    """``hook`` as nvct's :class:`Chain` when it is one (a spec's argv parsed), else None."""
    if isinstance(hook, Chain):
        return hook
    from nvct.edits import steps

    head = steps.chain_head(hook.args)
    if head is None:
        return None
    try:
        root, identity, argv = steps.chain_options(hook.args[len(head):])
    except Exception:  # noqa: BLE001 - a malformed chain is the hook's to report
        return None
    return Chain(hook.hook_name, hook.path, head, tuple(steps.parse(argv)), root, identity, hook.env,
                 hook.timeout, hook.reason)


class NetDevice(Record):
    """A host network interface moved into the container (CDI 1.1.0 ``netDevices``)."""

    __slots__ = ("host_interface_name", "name")
    host_interface_name: str
    name: str

    def to_cdi(self) -> dict[str, Any]:
        return {"hostInterfaceName": self.host_interface_name, "name": self.name}


class IntelRdt(Record):
    """The container's Intel RDT class of service (CDI 0.7.0+ ``intelRdt``).

    ``enable_cmt``/``enable_mbm`` exist in CDI 0.7.0-1.0.0 only, ``schemata``
    and ``enable_monitoring`` from 1.1.0; the keys are the OCI spec's too.
    """

    __slots__ = ("clos_id", "l3_cache_schema", "mem_bw_schema", "schemata", "enable_monitoring",
                 "enable_cmt", "enable_mbm")
    _defaults = {"clos_id": "", "l3_cache_schema": "", "mem_bw_schema": "", "schemata": None,
                 "enable_monitoring": False, "enable_cmt": False, "enable_mbm": False}
    clos_id: str
    l3_cache_schema: str
    mem_bw_schema: str
    schemata: tuple[str, ...] | None
    enable_monitoring: bool
    enable_cmt: bool
    enable_mbm: bool

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("closID", self.clos_id), ("l3CacheSchema", self.l3_cache_schema),
                           ("memBwSchema", self.mem_bw_schema)):
            if value:
                out[key] = value
        if self.schemata is not None:
            out["schemata"] = list(self.schemata)
        for key, flag in (("enableMonitoring", self.enable_monitoring),
                          ("enableCMT", self.enable_cmt), ("enableMBM", self.enable_mbm)):
            if flag:
                out[key] = True
        return out

    @classmethod
    def from_cdi(cls, data: dict[str, Any]) -> IntelRdt:
        schemata = data.get("schemata")
        return cls(
            clos_id=data.get("closID") or "",
            l3_cache_schema=data.get("l3CacheSchema") or "",
            mem_bw_schema=data.get("memBwSchema") or "",
            schemata=None if schemata is None else tuple(schemata),
            enable_monitoring=bool(data.get("enableMonitoring")),
            enable_cmt=bool(data.get("enableCMT")),
            enable_mbm=bool(data.get("enableMBM")),
        )


class ContainerEdits:
    """A set of edits; ``extend`` merges another set into this one."""

    __slots__ = ("env", "device_nodes", "mounts", "hooks", "additional_gids", "net_devices", "intel_rdt")

    def __init__(self, env: list[str] | None = None, device_nodes: list[DeviceNode] | None = None,
                 mounts: list[Mount] | None = None, hooks: list[Hook | Chain] | None = None,
                 additional_gids: list[int] | None = None, net_devices: list[NetDevice] | None = None,
                 intel_rdt: IntelRdt | None = None):
        self.env = list(env or ())
        self.device_nodes = list(device_nodes or ())
        self.mounts = list(mounts or ())
        self.hooks = list(hooks or ())
        self.additional_gids = list(additional_gids or ())
        self.net_devices = list(net_devices or ())
        self.intel_rdt = intel_rdt

    def __eq__(self, other):
        if not isinstance(other, ContainerEdits):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self) -> str:
        return "ContainerEdits(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__) + ")"

    def extend(self, other: ContainerEdits) -> ContainerEdits:
        """Merge ``other`` in, dropping exact repeats and keeping order.

        There is one RDT class per container: a later ``intel_rdt`` replaces
        an earlier one, as CDI merges them.
        """
        _merge(self.env, other.env)
        _merge(self.device_nodes, other.device_nodes)
        _merge(self.mounts, other.mounts)
        _merge(self.hooks, other.hooks)
        _merge(self.additional_gids, other.additional_gids)
        _merge(self.net_devices, other.net_devices)
        if other.intel_rdt is not None:
            self.intel_rdt = other.intel_rdt
        return self

    def is_empty(self) -> bool:
        return not (
            self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids
            or self.net_devices or self.intel_rdt is not None
        )

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_cdi() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_cdi() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_cdi() for h in self.hooks]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        if self.intel_rdt is not None:
            out["intelRdt"] = self.intel_rdt.to_cdi()
        if self.net_devices:
            out["netDevices"] = [n.to_cdi() for n in self.net_devices]
        return out

    @classmethod
    def from_cdi(cls, data: dict[str, Any]) -> ContainerEdits:
        """Build from a (validated) CDI ``containerEdits`` mapping."""
        return cls(
            env=list(data.get("env") or ()),
            device_nodes=[_device_from_cdi(d) for d in data.get("deviceNodes") or ()],
            mounts=[
                Mount(
                    host_path=m["hostPath"],
                    container_path=m["containerPath"],
                    type=m.get("type"),
                    options=tuple(m.get("options") or ()),
                )
                for m in data.get("mounts") or ()
            ],
            hooks=[_hook_from_cdi(h) for h in data.get("hooks") or ()],
            additional_gids=list(data.get("additionalGids") or ()),
            net_devices=[NetDevice(n["hostInterfaceName"], n["name"]) for n in data.get("netDevices") or ()],
            intel_rdt=None if data.get("intelRdt") is None else IntelRdt.from_cdi(data["intelRdt"]),
        )

    def to_json(self) -> dict[str, Any]:
        """Like :meth:`to_cdi`, but with every edit's reason (for explain)."""
        out = self.to_cdi()
        for key, items in (
            ("deviceNodes", self.device_nodes),
            ("mounts", self.mounts),
            ("hooks", self.hooks),
        ):
            for entry, item in zip(out.get(key, ()), items):
                if item.reason:
                    entry["reason"] = item.reason
        return out


def _hook_from_cdi(h: dict[str, Any]) -> Hook | Chain:
    hook = Hook(hook_name=h["hookName"], path=h["path"], args=tuple(h.get("args") or ()),
                env=tuple(h.get("env") or ()), timeout=h.get("timeout"))
    return as_chain(hook) or hook


def _device_from_cdi(d: dict[str, Any]) -> DeviceNode:
    return DeviceNode(
        path=d["path"],
        host_path=d.get("hostPath"),
        type=d.get("type") or "c",
        major=int(d.get("major") or 0),
        minor=int(d.get("minor") or 0),
        file_mode=d.get("fileMode"),
        uid=d.get("uid"),
        gid=d.get("gid"),
        permissions=d.get("permissions") or "",
    )


def _merge(into: list, items: Iterable) -> None:
    seen = set(into)
    for item in items:
        if item not in seen:
            into.append(item)
            seen.add(item)


def with_reason(edit, reason: str):
    """Return ``edit`` with its reason set (edits are immutable)."""
    return edit.replace(reason=reason)


def writable_last(mounts: Iterable[Mount]) -> list[Mount]:
    """``mounts`` with the writable ones last, otherwise in order.

    A writable host directory mounted early (the MPS pipe dir) would be where
    later targets land when an image symlink leads into it: runc and crun
    create missing targets by following the image's symlinks inside the root.
    Mounted last, nothing is created through it (docs/security.md).
    """
    mounts = list(mounts)
    return [m for m in mounts if not m.writable] + [m for m in mounts if m.writable]
