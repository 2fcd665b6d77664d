"""The in-container steps of nvct's hook chain, as values.

Edits carry these (in a :class:`nvct.edits.model.Chain`); they become hook
arguments only when a spec is written (:func:`to_argv`), and hook arguments
become steps again in one place (:func:`parse`), which the hook program, the
shim (for a CDI spec read from disk) and ``nvct explain`` share. One executor
runs them (nvct.hooks.steps.run). The argument form is the reference's
(``nvidia-cdi-hook <name> --flag value...``), steps separated by ``--``:
specs written by NVIDIA's tools name it, so it never changes.

Records, not dataclasses: the shim and the hook import this on every start.
"""

from __future__ import annotations

from nvct.base.record import Record

TYPE_CHECKING = False  # typing costs an import on every container start
if TYPE_CHECKING:
    from typing import Sequence


class Step(Record):
    """One step; ``name`` is its hook name in a spec."""

    __slots__ = ()
    name = ""

    def to_args(self) -> list[str]:
        """The flags after the name (:func:`to_argv` puts the name first)."""
        return []


class CreateSymlinks(Step):
    """``create-symlinks --link target::/link``: the driver libraries' SONAME and dev links."""

    __slots__ = ("links",)
    name = "create-symlinks"
    links: tuple[tuple[str, str], ...]

    def to_args(self) -> list[str]:
        return [a for target, link in self.links for a in ("--link", f"{target}::{link}")]


class EnableCudaCompat(Step):
    """``enable-cuda-compat``: the image's CUDA forward-compat libcuda first, where it works here.

    nvct's own flags: ``--gpu-brand`` (NVML brand ids), or ``--gpu-uuid`` with ``--driver-root``
    (the container's GPUs, whose brands NVML gives only when the note has a device list).
    """

    __slots__ = ("host_driver_version", "host_cuda_version", "compat_root", "gpu_brands", "gpu_uuids",
                 "driver_root")
    _defaults = {"host_driver_version": "", "host_cuda_version": "", "compat_root": "", "gpu_brands": (),
                 "gpu_uuids": (), "driver_root": ""}
    name = "enable-cuda-compat"
    host_driver_version: str
    host_cuda_version: str
    compat_root: str
    gpu_brands: tuple[str, ...]
    gpu_uuids: tuple[str, ...]
    driver_root: str

    def to_args(self) -> list[str]:
        out = _flag("host-driver-version", self.host_driver_version)
        out += _flag("host-cuda-version", self.host_cuda_version)
        out += _flag("cuda-compat-container-root", self.compat_root)
        out += [a for b in self.gpu_brands for a in ("--gpu-brand", b)]
        return out + [a for u in self.gpu_uuids for a in ("--gpu-uuid", u)] + _flag("driver-root", self.driver_root)


class UpdateLdcache(Step):
    """``update-ldcache --folder F [--library L]... [--ldconfig-path P]``."""

    __slots__ = ("folders", "libraries", "ldconfig_path")
    _defaults = {"libraries": (), "ldconfig_path": ""}
    name = "update-ldcache"
    folders: tuple[str, ...]
    #: nvct's: every name ldconfig would enter from the folders (the cache is then patched).
    libraries: tuple[str, ...]
    ldconfig_path: str

    def to_args(self) -> list[str]:
        return ([a for f in self.folders for a in ("--folder", f)]
                + [a for lib in self.libraries for a in ("--library", lib)]
                + _flag("ldconfig-path", self.ldconfig_path))


class CreateSonameSymlinks(Step):
    """``create-soname-symlinks --folder F``: the reference's ``ldconfig -n`` step."""

    __slots__ = ("folders", "ldconfig_path")
    _defaults = {"ldconfig_path": ""}
    name = "create-soname-symlinks"
    folders: tuple[str, ...]
    ldconfig_path: str

    def to_args(self) -> list[str]:
        return [a for f in self.folders for a in ("--folder", f)] + _flag("ldconfig-path", self.ldconfig_path)


class MaskParams(Step):
    """The driver's params masked (``ModifyDeviceFiles: 0``); ``hook``: which of the reference's two names."""

    __slots__ = ("hook",)
    _defaults = {"hook": "disable-device-node-modification"}
    hook: str

    @property
    def name(self) -> str:  # type: ignore[override]  # the hook name a spec gave, not a class constant
        return self.hook


class Chmod(Step):
    """``chmod --mode M --path P...`` (``mode`` as written: octal text)."""

    __slots__ = ("mode", "paths")
    name = "chmod"
    mode: str
    paths: tuple[str, ...]

    def to_args(self) -> list[str]:
        return _flag("mode", self.mode) + [a for p in self.paths for a in ("--path", p)]


class UpdateApplicationProfile(Step):
    __slots__ = ()
    name = "update-application-profile"


class BindMount(Step):
    """``bind-mount --host-path H --container-path C --options o,o``: a host path mounted last."""

    __slots__ = ("host_path", "container_path", "options")
    _defaults = {"options": ()}
    name = "bind-mount"
    host_path: str
    container_path: str
    options: tuple[str, ...]

    def to_args(self) -> list[str]:
        return ["--host-path", self.host_path, "--container-path", self.container_path,
                "--options", ",".join(self.options)]


class ReadonlyRoot(Step):
    """The spec's ``root.readonly``, applied after the chain's writes (crun applies it before hooks)."""

    __slots__ = ()
    name = "readonly-root"


#: The variables apply-cuda-memory-limits reads (MiB), each under the reference's two names, plural first.
MEMORY_REQUEST = ("NVIDIA_GPU_MEMORY_REQUESTS", "NVIDIA_GPU_MEMORY_REQUEST")
MEMORY_LIMIT = ("NVIDIA_GPU_MEMORY_LIMITS", "NVIDIA_GPU_MEMORY_LIMIT")


class ApplyCudaMemoryLimits(Step):
    """``apply-cuda-memory-limits --driver-root R --gpu-id UUID...`` (a createRuntime hook)."""

    __slots__ = ("driver_root", "gpu_ids")
    _defaults = {"driver_root": ""}
    name = "apply-cuda-memory-limits"
    driver_root: str
    gpu_ids: tuple[str, ...]

    def to_args(self) -> list[str]:
        return _flag("driver-root", self.driver_root) + [a for g in self.gpu_ids for a in ("--gpu-id", g)]


class CheckRequirements(Step):
    """``check-requirements --driver-version V [--cuda-version C] [--gpu PATH::ARCH::BRAND]...``."""

    __slots__ = ("driver_version", "cuda_version", "gpus")
    _defaults = {"cuda_version": "", "gpus": ()}
    name = "check-requirements"
    driver_version: str
    cuda_version: str
    gpus: tuple[tuple[str, str, str], ...]

    def to_args(self) -> list[str]:
        return (["--driver-version", self.driver_version] + _flag("cuda-version", self.cuda_version)
                + [a for g in self.gpus for a in ("--gpu", "::".join(g))])


class Unknown(Step):
    """A step this nvct does not know (a newer spec's): kept as written, skipped with a warning."""

    __slots__ = ("hook", "args")
    hook: str
    args: tuple[str, ...]

    @property
    def name(self) -> str:  # type: ignore[override]  # the hook name a spec gave, not a class constant
        return self.hook

    def to_args(self) -> list[str]:
        return list(self.args)


class Invalid(Unknown):
    """A known step whose arguments are wrong: kept as written; running it fails with ``error``."""

    __slots__ = ("hook", "args", "error")
    error: str


def _flag(name: str, value: str) -> list[str]:
    return [f"--{name}", value] if value else []


class Args:
    """``--name value`` pairs (repeatable), ``--name=value`` and ``--flag`` switches of one step."""

    def __init__(self, hook: str, argv: Sequence[str]):
        from nvct.base.errors import NvctError

        self.values: dict[str, list[str]] = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if not arg.startswith("--"):
                raise NvctError(f"{hook}: unexpected argument {arg!r}")
            name, eq, value = arg[2:].partition("=")
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    i += 1
                    value = argv[i]
                else:
                    value = "true"
            self.values.setdefault(name, []).append(value)
            i += 1

    def all(self, name: str) -> tuple[str, ...]:
        return tuple(self.values.get(name, ()))

    def one(self, name: str) -> str:
        values = self.values.get(name)
        return values[-1] if values else ""


def _links(a: Args) -> CreateSymlinks:
    from nvct.base.errors import NvctError

    pairs = []
    for spec in a.all("link"):
        target, sep, link = spec.partition("::")
        if not sep or not target or not link.startswith("/"):
            raise NvctError(f"create-symlinks: invalid --link {spec!r} (expected target::/abs/link)")
        pairs.append((target, link))
    return CreateSymlinks(tuple(pairs))


def _chmod(a: Args) -> Chmod:
    from nvct.base.errors import NvctError

    raw = a.one("mode")
    try:
        int(raw, 8)
    except ValueError:
        raise NvctError(f"chmod: invalid --mode {raw!r} (expected octal, e.g. 755)") from None
    return Chmod(raw, a.all("path"))


def _gpus(a: Args) -> tuple[tuple[str, str, str], ...]:
    out = []
    for item in a.all("gpu"):
        path, _, rest = item.partition("::")
        arch, _, brand = rest.partition("::")
        out.append((path, arch, brand))
    return tuple(out)


#: Hook name -> how its flags become the step.
_PARSERS = {
    "create-symlinks": _links,
    "enable-cuda-compat": lambda a: EnableCudaCompat(a.one("host-driver-version"), a.one("host-cuda-version"),
                                                     a.one("cuda-compat-container-root"), a.all("gpu-brand"),
                                                     a.all("gpu-uuid"), a.one("driver-root")),
    "update-ldcache": lambda a: UpdateLdcache(a.all("folder"), a.all("library"), a.one("ldconfig-path")),
    "create-soname-symlinks": lambda a: CreateSonameSymlinks(a.all("folder"), a.one("ldconfig-path")),
    "disable-device-node-modification": lambda a: MaskParams("disable-device-node-modification"),
    "update-nvidia-params": lambda a: MaskParams("update-nvidia-params"),  # the reference's newer name
    "chmod": _chmod,
    "update-application-profile": lambda a: UpdateApplicationProfile(),
    "bind-mount": lambda a: BindMount(a.one("host-path"), a.one("container-path"),
                                      tuple(o for o in ",".join(a.all("options")).split(",") if o)),
    "readonly-root": lambda a: ReadonlyRoot(),
    "apply-cuda-memory-limits": lambda a: ApplyCudaMemoryLimits(a.one("driver-root"), a.all("gpu-id")),
    "check-requirements": lambda a: CheckRequirements(a.one("driver-version"), a.one("cuda-version"), _gpus(a)),
}
#: Every hook name nvct runs (the reference's, and nvct's own).
NAMES = tuple(_PARSERS)


def parse_step(name: str, argv: Sequence[str]) -> Step:
    """One step from its name and flags; wrong flags give an :class:`Invalid` step (the hook reports it)."""
    from nvct.base.errors import NvctError

    parser = _PARSERS.get(name)
    if parser is None:
        return Unknown(name, tuple(argv))
    try:
        return parser(Args(name, argv))
    except NvctError as e:
        return Invalid(name, tuple(argv), str(e))


def parse(argv: Sequence[str]) -> list[Step]:
    """``name flags... [-- name flags...]...`` as steps: the one parser of the chain's form."""
    groups: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            groups.append([])
        else:
            groups[-1].append(arg)
    return [parse_step(g[0], g[1:]) for g in groups if g]


def to_argv(steps: Sequence[Step]) -> list[str]:
    """The steps as hook arguments, ``--`` between them: the one writer of the chain's form."""
    out: list[str] = []
    for step in steps:
        if out:
            out.append("--")
        out += [step.name, *step.to_args()]
    return out


#: How each hook program starts nvct's hook chain (``nvidia-ctk.path`` may name either of NVIDIA's).
_CHAIN_PREFIXES = {"nvidia-ctk": ("nvidia-ctk", "hook", "chain"), "nvidia-cdi-hook": ("nvidia-cdi-hook", "chain")}
_NVCT_CHAIN = ("nvct", "hook", "chain")


def chain_prefix(hook_path: str) -> list[str]:
    """The hook's argv before the steps: ``nvidia-ctk hook chain``, ``nvidia-cdi-hook chain`` or ``nvct hook chain``."""
    return list(_CHAIN_PREFIXES.get(hook_path.rpartition("/")[2], _NVCT_CHAIN))


def chain_head(args: Sequence[str]) -> tuple[str, ...] | None:
    """The program's part of a chain hook's argv (``nvct hook chain``, ...), or None: not nvct's chain."""
    args = tuple(args)
    for prefix in (_NVCT_CHAIN, *_CHAIN_PREFIXES.values()):
        if args[:len(prefix)] == prefix:
            return prefix
    return None


def chain_steps(args: Sequence[str]) -> list[str] | None:
    """A hook's arguments after the program's part when it is nvct's hook chain, else None."""
    head = chain_head(args)
    return None if head is None else list(args)[len(head):]


#: The chain's own options, before its steps: the container's root as the shim saw it.
ROOT_OPTION = "--container-root"
#: The root's ``st_dev:st_ino``, taken by the shim on the host (nvct.rootfs.root.root_identity).
IDENTITY_OPTION = "--root-identity"


def chain_options(argv: Sequence[str]) -> tuple[str | None, tuple[int, int] | None, list[str]]:
    """(root, identity, the steps' argv) of the arguments after a chain's head."""
    from nvct.base.errors import NvctError

    argv = list(argv)
    root = identity = None
    while argv[:1] in ([ROOT_OPTION], [IDENTITY_OPTION]) and len(argv) > 1:
        if argv[0] == ROOT_OPTION:
            root = argv[1]
        else:
            dev, sep, ino = argv[1].partition(":")
            if not (sep and dev.isascii() and dev.isdigit() and ino.isascii() and ino.isdigit()):
                raise NvctError(f"chain: invalid {IDENTITY_OPTION} {argv[1]!r} (expected DEV:INO)")
            identity = (int(dev), int(ino))
        argv = argv[2:]
    return root, identity, argv


def options_argv(root: str | None, identity: tuple[int, int] | None) -> list[str]:
    """:func:`chain_options`' inverse."""
    out = [ROOT_OPTION, root] if root else []
    return out + ([IDENTITY_OPTION, f"{identity[0]}:{identity[1]}"] if identity else [])
