"""Container engines: does each one name an NVIDIA runtime that exists, and will ``--gpus`` work?

Engine configs are only read (with the standard library's parsers, so the
doctor stays fast). A config that does not exist means the engine is not
set up here: that is reported, not failed.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys

from nvct.base.errors import ConfigError
from nvct.config.file import parse_toml
from nvct.doctor import clipaths
from nvct.doctor.clipaths import read_json
from nvct.doctor.model import Context, fail, info, ok, warn
from nvct.engines.containerd import config_version, cri_drift, plugin_name
from nvct.engines.docker import dockerd_pid
from nvct.engines.document import MISSING
from nvct.engines.engine import read_file
from nvct.oci import environ as hookenv

RUNTIME_BINARY = "nvidia-container-runtime"
HOOK_BINARY = "nvidia-container-runtime-hook"
CLI_BINARY = "nvidia-container-cli"


class _Runtimes:
    """What an engine's config files say: runtime name -> (binary, file), and the default."""

    def __init__(self, files: list[str]):
        self.files = files
        self.runtimes: dict[str, tuple[str | None, str]] = {}
        self.default: tuple[str, str] | None = None

    def nvidia(self) -> dict[str, tuple[str | None, str]]:
        return {name: value for name, value in self.runtimes.items()
                if name.startswith("nvidia") or os.path.basename(value[0] or "").startswith(RUNTIME_BINARY)}


# --- docker ---
def check_docker(ctx: Context):
    path = ctx.options.docker_config
    try:
        data = read_json(path)
    except ConfigError as e:
        yield fail("runtime.docker", f"{e} (dockerd does not start with it)", f"correct {path}")
        return
    if data is None:
        yield info("runtime.docker", f"no {path}: docker is not configured here")
        return
    found = _Runtimes([path])
    runtimes = data.get("runtimes") or {}
    if not isinstance(runtimes, dict):
        yield fail("runtime.docker", f"{path}: runtimes is not an object", f"correct {path}")
        return
    for name, entry in runtimes.items():
        binary = entry.get("path") if isinstance(entry, dict) else None
        found.runtimes[name] = (binary if isinstance(binary, str) else None, path)
    default = data.get("default-runtime")
    if isinstance(default, str):
        found.default = (default, path)
    yield from _engine("runtime.docker", "docker", found, ctx.options.default_path, builtin=("runc",),
                       configure=f"nvct runtime configure --runtime docker --config {path}",
                       apply="then reload dockerd: kill -HUP $(cat " + ctx.options.docker_pidfile + ")")


def check_docker_gpus(ctx: Context):
    """``docker run --gpus`` needs the hook on the PATH dockerd had when it started."""
    pid, how = dockerd_pid(ctx.options.docker_socket, ctx.options.docker_pidfile)
    if pid is None:
        if not (os.path.exists(ctx.options.docker_config) or _which("dockerd", ctx.options.default_path)):
            yield info("runtime.docker-gpus", "no dockerd runs here and docker is not installed")
            return

        route, dirs = clipaths.on_this_node("docker", path_env=ctx.options.default_path,
                                            docker_socket=ctx.options.docker_socket,
                                            docker_pidfile=ctx.options.docker_pidfile,
                                            docker_config=ctx.options.docker_config)
        if route.route == "cdi":
            yield from _cdi_route("runtime.docker-gpus", f"no dockerd runs ({how}); started with the default PATH",
                                  route, dirs, ["all"])
            return
        hook = _which(HOOK_BINARY, ctx.options.default_path)
        if hook:
            yield ok("runtime.docker-gpus", f"no dockerd runs ({how}); started with the default PATH it "
                     f"finds {hook}, so docker run --gpus will work")
        else:
            yield warn("runtime.docker-gpus",
                       f"no dockerd runs ({how}), and the default PATH ({ctx.options.default_path}) has no "
                       f"{HOOK_BINARY}: docker run --gpus will fail", _link_hook_fix(ctx.options.default_path))
        return
    try:
        environ = _read_environ(pid)
    except OSError as e:
        yield info("runtime.docker-gpus", f"dockerd is pid {pid} ({how}), but its environment cannot be "
                   f"read: {e.strerror}", "run nvct doctor as root")
        return
    path = environ.get("PATH")
    if path is None:
        yield fail("runtime.docker-gpus", f"dockerd (pid {pid}, {how}) started without PATH: docker run --gpus "
                   f"fails with 'could not select device driver \"\" with capabilities: [[gpu]]'",
                   f"start dockerd with PATH={ctx.options.default_path} (its service's Environment=)")
        return
    route = _docker_route(ctx, pid, path)
    if route is not None and route.route == "cdi":
        yield from _cdi_route("runtime.docker-gpus", f"dockerd (pid {pid}, {how})", route,
                              _docker_spec_dirs(ctx), ["all"])
        return
    hook = _which(HOOK_BINARY, path)
    if hook is None:
        yield fail("runtime.docker-gpus",
                   f"dockerd (pid {pid}, {how}) started with PATH={path}, where there is no {HOOK_BINARY}: "
                   f"docker run --gpus fails with 'could not select device driver \"\" with capabilities: "
                   f"[[gpu]]'" + (f" ({route.why})" if route is not None else ""),
                   _link_hook_fix(path) + ", then restart dockerd (it looks the hook up once, at start)")
        return
    problem = _fails_in(environ, [hook, "--version"])
    if problem:
        yield fail("runtime.docker-gpus", f"dockerd (pid {pid}, {how}) finds {hook}, but the hook fails in "
                   f"dockerd's environment (what docker run --gpus hands it): {problem}",
                   "upgrade nvct (its programs set an engine's own variables aside), or start dockerd without the "
                   "variable named (its service's Environment=); then restart dockerd")
        return
    started = _start_time(pid)
    # The start time is known to a second (the kernel's btime is whole seconds): no warning inside it.
    if started is not None and os.lstat(hook).st_ctime > started + 1.0:
        yield warn("runtime.docker-gpus", f"{hook} appeared after dockerd (pid {pid}) started, and dockerd "
                   f"looks for it only at start: docker run --gpus may fail until it restarts",
                   "restart dockerd")
        return
    yield ok("runtime.docker-gpus", f"dockerd (pid {pid}, {how}) finds {hook} on its PATH: "
             f"docker run --gpus works, on the hook path" + (f" ({route.why})" if route is not None else ""))


def _docker_route(ctx: Context, pid: int, path: str):
    """Which path docker run --gpus takes with this dockerd (None: its program cannot be read)."""
    binary = clipaths.exe(pid)
    if binary is None:
        return None
    return clipaths.docker_path(binary, path, cdi_enabled=clipaths.docker_cdi(ctx.options.docker_config)[0])


def _docker_spec_dirs(ctx: Context) -> list[str]:
    return clipaths.docker_cdi(ctx.options.docker_config)[1]


def _cdi_route(id: str, who: str, route, dirs: list[str], values: list[str]):
    """The CDI path: the names ``--gpus`` becomes must resolve in the engine's spec directories."""
    names = [n for v in values for n in clipaths.cdi_names(route.cli, v)]
    missing, have = clipaths.unresolved(names, dirs)
    example = f"{route.cli} run --gpus {values[0]}"
    if missing:
        yield fail(id, f"{who}: {route.why}; {example} asks for {', '.join(missing)}, which no spec in "
                   f"{', '.join(dirs)} defines ({len(have)} {clipaths.KIND} devices there): it fails to start",
                   f"nvct cdi generate --output {clipaths.DEFAULT_SPEC_DIRS[1]}/nvidia.yaml (and keep "
                   f"nvidia-cdi-refresh enabled, so it follows the driver)")
        return
    yield ok(id, f"{who}: {route.why}; {example} takes the CDI path: {', '.join(names)} resolve in "
             f"{', '.join(dirs)} ({len(have)} {clipaths.KIND} devices)")


def check_ctr_gpus(ctx: Context):
    """``ctr run --gpus`` (and nerdctl's): the client looks ``nvidia-container-cli`` up on its own PATH
    and hands the hook its own environment, whatever containerd's is: that of the shell this runs in."""
    # This shell's environment, with what nvct's front set aside for its own Python put back.
    environ = dict(ctx.options.env)
    environ.update((k, v) for k, v in hookenv.caller_environ().items() if k in hookenv.dropped)
    path = environ.get("PATH", "")
    ctr = _which("ctr", path) if path else None
    if not ctr:
        yield info("runtime.ctr-gpus", "no ctr on this shell's PATH: ctr run --gpus is not used here")
        return
    route = clipaths.client_path("ctr", ctr, path)
    if route.route == "cdi":  # containerd 2.3's ctr: CDI names, in containerd's spec directories
        yield from _cdi_route("runtime.ctr-gpus", "ctr", route, list(clipaths.DEFAULT_SPEC_DIRS), ["0"])
        return
    cli = _which(CLI_BINARY, path)
    if cli is None:  # info: most nodes with ctr (every containerd one) never run ctr run --gpus
        yield info("runtime.ctr-gpus", f"this shell's PATH ({path}) has no {CLI_BINARY}: ctr run --gpus would fail "
                   f"here", f"for ctr run --gpus: ln -s {our_binary(CLI_BINARY)} /usr/bin/{CLI_BINARY}")
        return
    # The version, started as ctr's hook starts it (configure: a hook's start, in the caller's environment).
    problem = _fails_in(environ, [cli, "--version", "configure"])
    if problem:
        yield fail("runtime.ctr-gpus", f"{cli} fails in this shell's environment (what ctr run --gpus hands its "
                   f"hook): {problem}", "upgrade nvct (its programs set a caller's own variables aside), or unset "
                   "the variable named before ctr run --gpus")
        return
    yield ok("runtime.ctr-gpus", f"ctr run --gpus takes the hook path ({route.why}), and it runs in this environment")


def check_nerdctl_gpus(ctx: Context):
    """``nerdctl run --gpus``: nvidia-container-cli on the caller's PATH, or CDI names (nerdctl 2.3)."""
    route, dirs = clipaths.on_this_node("nerdctl", path_env=ctx.options.env.get("PATH", ""))
    if route.route == "cdi":
        yield from _cdi_route("runtime.nerdctl-gpus", "nerdctl", route, dirs, ["all"])
    elif route.route == "hook":
        yield ok("runtime.nerdctl-gpus", f"nerdctl run --gpus takes the hook path ({route.why})")
    elif route.program:  # nerdctl is here, its hook program is not
        yield info("runtime.nerdctl-gpus", f"{route.why}",
                   f"for nerdctl run --gpus: ln -s {our_binary(CLI_BINARY)} /usr/bin/{CLI_BINARY}")


def _fails_in(environ: dict[str, str], argv: list[str]) -> str | None:
    """The last line a program says when it fails, started with ``environ`` from ``/``; None if it runs."""
    try:
        done = subprocess.run(argv, env=environ, cwd="/", stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def _start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), from /proc/<pid>/stat and /proc/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _read_environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read()
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep:
            out.setdefault(key, value)
    return out


def _link_hook_fix(path: str) -> str:
    dirs = [d for d in path.split(":") if d]
    target = "/usr/bin" if "/usr/bin" in dirs else (dirs[0] if dirs else "/usr/bin")
    return f"ln -s {our_binary(HOOK_BINARY)} {target}/{HOOK_BINARY}"


# --- containerd ---
def check_containerd(ctx: Context):
    path = ctx.options.containerd_config
    try:
        main = _read_toml(path)
        if main is None:
            yield info("runtime.containerd", f"no {path}: containerd is not configured here")
            return
        version = config_version(main, path, 2)
        files = [(path, main, version)]
        for imported in _imports(path, main):
            data = _read_toml(imported) or {}
            files.append((imported, data, config_version(data, imported, version) if "version" in data else version))
    except ConfigError as e:
        yield fail("runtime.containerd", f"{e} (containerd does not start with it)", f"correct {path}")
        return
    found = _Runtimes([f for f, _, _ in files])
    for file, data, file_version in files:
        cri = ((data.get("plugins") or {}).get(plugin_name(file_version)) or {}).get("containerd") or {}
        for name, entry in (cri.get("runtimes") or {}).items():
            options = entry.get("options") if isinstance(entry, dict) else None
            options = options if isinstance(options, dict) else {}
            binary = options.get("BinaryName") or options.get("Runtime")
            found.runtimes[name] = (binary if isinstance(binary, str) and binary else None, file)
        if isinstance(cri.get("default_runtime_name"), str):
            found.default = (cri["default_runtime_name"], file)
    # containerd's built-in CRI config defines runc, whatever the file says.
    yield from _engine("runtime.containerd", "containerd", found, ctx.options.default_path, builtin=("runc",),
                       configure=f"nvct runtime configure --runtime containerd --config {path}",
                       apply="then restart containerd")
    yield from _containerd_drift(path, files, found)


def _containerd_drift(path: str, files: list, found: _Runtimes):
    """A drop-in's copy of the CRI section that hides later edits of the main file."""
    main, version = files[0][1], files[0][2]
    plugin = plugin_name(version)
    ours = {file for _, file in found.nvidia().values()}
    for file, data, _ in files[1:]:
        mine = (main.get("plugins") or {}).get(plugin)
        theirs = (data.get("plugins") or {}).get(plugin)
        if file not in ours or not isinstance(mine, dict) or not isinstance(theirs, dict):
            continue
        drift = cri_drift(mine, theirs, whole_section=version < 3)
        if not drift:
            yield ok("runtime.containerd-drift", f"{file} keeps every CRI setting of {path}")
            continue
        key, value, override = drift[0]
        more = f" (and {len(drift) - 1} more)" if len(drift) > 1 else ""
        said = "drops" if override is MISSING else f"sets {_toml_value(override)} for"
        yield warn("runtime.containerd-drift",
                   f"{file} {said} {'.'.join(key)}, which {path} sets to {_toml_value(value)}{more}: "
                   f"containerd uses the drop-in's copy, so edits of {path} made after nvct configured it "
                   f"are silently overridden",
                   f"nvct runtime configure --runtime containerd --config {path} --drop-in-config {file}"
                   f"{_keeping(file, found, mine, theirs)} (brings the copy up to date); then restart containerd")


def _keeping(file: str, found: _Runtimes, mine: dict, theirs: dict) -> str:
    """configure's flags that keep what the drop-in holds now: without them it would reset its runtime's
    path to /usr/bin's, and take nvidia off as the default (as the reference's configure does)."""
    runtimes = {name: binary for name, (binary, where) in found.nvidia().items() if where == file and binary}
    if not runtimes:
        return ""
    name = "nvidia" if "nvidia" in runtimes else sorted(runtimes)[0]
    flags = [] if name == "nvidia" else [f"--nvidia-runtime-name {shlex.quote(name)}"]
    flags.append(f"--nvidia-runtime-path {shlex.quote(runtimes[name])}")
    defaults = [(table.get("containerd") or {}).get("default_runtime_name") for table in (mine, theirs)]
    if name in defaults:  # the main file's (the operator's edit) or the drop-in's (--set-as-default)
        flags.append("--set-as-default")
    if True in (mine.get("enable_cdi"), theirs.get("enable_cdi")):
        flags.append("--enable-cdi")
    return " " + " ".join(flags)


def _toml_value(value) -> str:
    return json.dumps(value) if isinstance(value, (str, bool, int, float, list)) else repr(value)


def _imports(path: str, data: dict) -> list[str]:
    imports = data.get("imports") or []
    if not isinstance(imports, list):
        raise ConfigError(f"{path}: imports is not a list")
    out: list[str] = []
    for pattern in imports:
        if not isinstance(pattern, str):
            raise ConfigError(f"{path}: imports holds a non-string")
        full = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
        out.extend(p for p in sorted(glob.glob(full)) if p not in out and os.path.abspath(p) != os.path.abspath(path))
    return out


# --- cri-o ---
def check_crio(ctx: Context):
    directory = ctx.options.crio_dir
    main = os.path.join(os.path.dirname(os.path.abspath(directory)), "crio.conf")
    files = [main] if os.path.isfile(main) else []
    try:
        files += [os.path.join(directory, n) for n in sorted(os.listdir(directory))
                  if os.path.isfile(os.path.join(directory, n))]
    except FileNotFoundError:
        pass
    except OSError as e:
        yield fail("runtime.crio", f"{directory}: {e.strerror}", f"check the permissions of {directory}")
        return
    if not files:
        yield info("runtime.crio", f"no {main} nor files in {directory}: cri-o is not configured here")
        return
    found = _Runtimes(files)
    try:
        for file in files:
            runtime = ((_read_toml(file) or {}).get("crio") or {}).get("runtime") or {}
            for name, entry in (runtime.get("runtimes") or {}).items():
                binary = entry.get("runtime_path") if isinstance(entry, dict) else None
                # An empty runtime_path: cri-o looks the runtime's name up on PATH.
                found.runtimes[name] = ((binary or name) if isinstance(binary, (str, type(None))) else None, file)
            if isinstance(runtime.get("default_runtime"), str):
                found.default = (runtime["default_runtime"], file)
    except ConfigError as e:
        yield fail("runtime.crio", f"{e} (cri-o does not start with it)", "correct that file")
        return
    yield from _engine("runtime.crio", "cri-o", found, ctx.options.default_path, builtin=("crun", "runc"),
                       configure=f"nvct runtime configure --runtime crio --drop-in-config "
                                 f"{os.path.join(directory, '99-nvidia.toml')}",
                       apply="then restart cri-o")


# --- shared ---
def _engine(id: str, engine: str, found: _Runtimes, path_env: str, *, builtin, configure: str, apply: str):
    where = " + ".join(found.files)
    if found.default and found.default[0] not in found.runtimes and found.default[0] not in builtin:
        name, file = found.default
        yield fail(id, f"{file}: the default runtime {name!r} is not defined ({engine} cannot run containers)",
                   f"make the default a defined runtime in {file} (the NVIDIA one: {configure} --set-as-default); "
                   f"{apply}")
    nvidia = found.nvidia()
    if not nvidia:
        yield warn(id, f"{where} defines no NVIDIA runtime (runtimes: {', '.join(found.runtimes) or 'none'})",
                   f"{configure}; {apply}")
        return
    for name, (binary, file) in nvidia.items():
        resolved = _resolve(binary, path_env)
        if resolved is None:
            yield fail(id, f"{file}: runtime {name!r} runs {binary or '(nothing)'}, which is not an executable "
                       f"file: GPU containers fail to start",
                       f"{configure} --nvidia-runtime-name {name} --nvidia-runtime-path "
                       f"{our_binary(RUNTIME_BINARY)}; {apply}")
            continue
        default = " (the default)" if found.default and found.default[0] == name else ""
        yield ok(id, f"{file}: runtime {name!r}{default} runs {resolved}")


def _resolve(binary: str | None, path_env: str) -> str | None:
    if not binary:
        return None
    if os.path.isabs(binary):
        return binary if os.path.isfile(binary) and os.access(binary, os.X_OK) else None
    return _which(binary, path_env)


def _which(name: str, path_env: str) -> str | None:
    return shutil.which(name, path=path_env)


def our_binary(name: str) -> str:
    """Where this nvct's ``name`` lives: beside the running program, else on PATH, else /usr/bin."""
    for directory in (os.path.dirname(os.path.abspath(sys.argv[0] or "")), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name) or f"/usr/bin/{name}"


def _read_toml(path: str):
    raw = read_file(path)
    return None if raw is None else parse_toml(raw, path)


CHECKS = (check_docker, check_docker_gpus, check_containerd, check_ctr_gpus, check_nerdctl_gpus, check_crio)
