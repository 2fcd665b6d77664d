"""Which path a CLI's ``--gpus`` takes on this node: the NVIDIA hook, or a CDI request.

``docker run --gpus``, ``ctr run --gpus`` and ``nerdctl run --gpus`` predate
CDI and call NVIDIA's hook programs. Newer builds turn the flag into CDI
device names instead (moby#50228, containerd#12537, nerdctl#4617), which then
must resolve in the engine's CDI spec directories. Which one a given build
does is read from the program itself: a build that runs a hook program must
look its name up, so the name is in the binary; one that never looks it up
cannot run it. Versions are reported, not trusted: distributions patch.

Measured here: Debian's docker.io 28.5.2 and containerd 2.1.9 (its ctr) still
take the hook path; podman 5.8's ``--gpus`` asks for CDI devices.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from dataclasses import dataclass

from nvct.base.errors import ConfigError
from nvct.cdi.registry import Registry
from nvct.engines.docker import dockerd_pid
from nvct.engines.engine import read_file

HOOK = "hook"
CDI = "cdi"
NONE = "none"

#: The program each CLI's hook path runs, looked up on the PATH named in :class:`Path`.
HOOK_PROGRAMS = {"docker": "nvidia-container-runtime-hook", "ctr": "nvidia-container-cli",
                 "nerdctl": "nvidia-container-cli"}
#: What dockerd looks up to route ``--gpus`` through CDI (moby#50228).
CDI_HOOK = "nvidia-cdi-hook"
#: Where containerd, dockerd and podman read CDI specs unless configured otherwise.
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class Path:
    """A CLI's ``--gpus`` path: ``HOOK``, ``CDI`` or ``NONE`` (fails), and why."""

    cli: str
    route: str
    why: str
    #: the program that runs (HOOK) or would be looked for.
    program: str | None = None


def knows(binary: str, name: str) -> bool:
    """Whether the program file ``binary`` holds the string ``name`` (a program it looks up)."""
    try:
        with open(binary, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(name.encode()) != -1
    except (OSError, ValueError):  # ValueError: an empty file
        return False


def docker_path(dockerd: str, path_env: str, *, cdi_enabled: bool = True) -> Path:
    """``docker run --gpus`` with the dockerd program ``dockerd`` started with ``PATH=path_env``.

    A dockerd that knows ``nvidia-cdi-hook`` (moby#50228; not Debian's 28.5.2) routes
    the flag through CDI when that program is on its PATH and CDI is enabled;
    otherwise it needs ``nvidia-container-runtime-hook`` on its PATH.
    """
    hook = HOOK_PROGRAMS["docker"]
    cdi_hook = shutil.which(CDI_HOOK, path=path_env)
    if knows(dockerd, CDI_HOOK) and cdi_hook and cdi_enabled:
        return Path("docker", CDI, f"{dockerd} routes --gpus through CDI: {cdi_hook} is on its PATH", cdi_hook)
    found = shutil.which(hook, path=path_env)
    if not knows(dockerd, CDI_HOOK):
        why = f"{dockerd} has no CDI route for --gpus (it never looks up {CDI_HOOK})"
    elif not cdi_enabled:
        why = f"{dockerd} would route --gpus through CDI, but CDI is disabled (features.cdi)"
    else:
        why = f"{dockerd} would route --gpus through CDI, but no {CDI_HOOK} is on its PATH"
    if found:
        return Path("docker", HOOK, why, found)
    return Path("docker", NONE, f"{why}, and no {hook} is on its PATH: --gpus fails "
                f"('could not select device driver \"\" with capabilities: [[gpu]]')", hook)


def client_path(cli: str, binary: str, path_env: str) -> Path:
    """``ctr``/``nerdctl run --gpus``: the client itself either runs ``nvidia-container-cli`` (found
    on its own PATH) as a prestart hook, or asks for CDI devices (containerd 2.3, nerdctl 2.3)."""
    program = HOOK_PROGRAMS[cli]
    if not knows(binary, program):
        return Path(cli, CDI, f"{binary} asks for CDI devices ({KIND}=INDEX) for --gpus")
    found = shutil.which(program, path=path_env)
    if found:
        return Path(cli, HOOK, f"{binary} runs {found} as a prestart hook", found)
    return Path(cli, NONE, f"{binary} runs {program} for --gpus, and this PATH has none: --gpus fails", program)


def cdi_names(cli: str, value: str) -> list[str]:
    """The CDI device names a ``--gpus`` value becomes on the CDI path.

    docker and nerdctl: ``all``, ``N`` (a count: the first N indices),
    ``device=ID[,ID]`` (indices, UUIDs, MIG names as given); ctr and podman:
    ``all`` or names (podman 5.8 measured: ``--gpus 1`` is GPU 1).
    """
    value = value.strip().strip('"')
    if cli in ("ctr", "podman") and value != "all":
        return [f"{KIND}={i.strip()}" for i in value.split(",") if i.strip()]
    fields = [f.strip() for f in value.split(",")]
    if value == "all":
        return [f"{KIND}=all"]
    if value.isdigit():
        return [f"{KIND}={i}" for i in range(int(value))]
    ids: list[str] = []
    for f in fields:
        if f.startswith("device="):
            ids.append(f.partition("=")[2])
        elif f.startswith(("capabilities=", "driver=", "count=", "options=")):
            continue
        elif ids:
            ids.append(f)  # device=0,1: the list goes on
    return [f"{KIND}={i}" for i in ids if i]


def unresolved(names: list[str], dirs=DEFAULT_SPEC_DIRS) -> tuple[list[str], list[str]]:
    """(names no spec in ``dirs`` defines, every NVIDIA device name there)."""
    registry = Registry(dirs)
    have = [n for n in registry.device_names() if n.startswith(KIND + "=")]
    return [n for n in names if n not in registry.devices], have


def exe(pid: int) -> str | None:
    """The program a running process runs (its /proc link), if it can be read."""
    try:
        return os.path.realpath(f"/proc/{pid}/exe") if os.path.exists(f"/proc/{pid}/exe") else None
    except OSError:
        return None


def on_this_node(cli: str, *, path_env: str, docker_socket: str = "/var/run/docker.sock",
                 docker_pidfile: str = "/var/run/docker.pid",
                 docker_config: str = "/etc/docker/daemon.json") -> tuple[Path, list[str]]:
    """The path ``cli run --gpus`` takes here, and the CDI spec directories its engine reads.

    docker: the running dockerd's program and PATH (else ``dockerd`` on ``path_env``);
    ctr, nerdctl: the program on ``path_env``, the caller's PATH.
    """
    if cli == "podman":  # podman 5's --gpus always asks for CDI devices
        return Path(cli, CDI, f"podman asks for CDI devices ({KIND}=NAME) for --gpus"), list(DEFAULT_SPEC_DIRS)
    if cli != "docker":
        binary = shutil.which(cli, path=path_env)
        if binary is None:
            return Path(cli, NONE, f"no {cli} on PATH ({path_env})"), list(DEFAULT_SPEC_DIRS)
        return client_path(cli, binary, path_env), list(DEFAULT_SPEC_DIRS)

    enabled, dirs = docker_cdi(docker_config)
    pid, _ = dockerd_pid(docker_socket, docker_pidfile)
    binary = exe(pid) if pid is not None else None
    if binary is not None:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(i.decode("utf-8", "replace").partition("=")[::2] for i in f.read().split(b"\0") if i)
            path_env = env.get("PATH", "")
        except OSError:
            pass
    else:
        binary = shutil.which("dockerd", path=path_env)
        if binary is None:
            return Path(cli, NONE, f"no dockerd runs, and none is on PATH ({path_env})"), dirs
    return docker_path(binary, path_env, cdi_enabled=enabled), dirs


def docker_cdi(config_path: str) -> tuple[bool, list[str]]:
    """dockerd's CDI settings: enabled (``features.cdi``, on unless false) and its spec directories."""
    try:
        config = read_json(config_path) or {}
    except ConfigError:  # runtime.docker says what is wrong with the file
        config = {}
    dirs = config.get("cdi-spec-dirs")
    features = config.get("features")
    enabled = (features.get("cdi", True) if isinstance(features, dict) else True) is not False
    return enabled, (list(dirs) if isinstance(dirs, list) and dirs else list(DEFAULT_SPEC_DIRS))


def hook_devices(cli: str, value: str) -> str:
    """NVIDIA_VISIBLE_DEVICES the hook path hands the hook for a ``--gpus`` value."""
    names = cdi_names(cli, value)
    ids = [n.partition("=")[2] for n in names]
    return ",".join(ids) or "void"


def read_json(path: str):
    """An engine's JSON config file as a dict (None: no such file); bad JSON is a ConfigError."""
    raw = read_file(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw or b"{}")
    except ValueError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data
