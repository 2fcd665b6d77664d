"""What removing the nvct package does to the node: undo what nvct configured, name what is left.

Run by the package's removal script (deb ``prerm remove``, rpm ``%preun``) while
nvct's programs are still there, as ``python3 -I -m nvct.toolkit.uninstall``:

* every engine config ``nvct runtime configure`` changed (docker, containerd,
  cri-o, the OCI hook file; :mod:`nvct.engines.configured`) is unconfigured
  from its undo record, so no engine keeps a runtime that runs a removed program
  (what a running ``nvct toolkit install`` changed stays: it runs its own copy);
* CDI specs under ``/var/run/cdi`` whose hooks run nvct's programs (what the
  package's ``nvidia-cdi-refresh`` unit generates) are removed;
* anything else that still names nvct's programs (a runtime entry nvct did not
  write, a spec in ``/etc/cdi``) is listed with what to do about it;
* for each runtime program a running container's shim still names, a stand-in
  (:mod:`nvct.toolkit.standin`) is written to ``/run/nvct-standins``; the
  removal script moves it to the program's path once the package's file is gone,
  so the container can still be killed and deleted. It removes itself with the
  last such container (a reboot, which ends them all, clears ``/run``).

``--in-favour PACKAGE`` (the NVIDIA Container Toolkit replacing nvct, whose
programs have the same names) changes nothing. Never fails: a removal must not
stop half-way; what could not be undone is said.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import sys
import time

from nvct import engines as runtimes
from nvct.base.errors import NvctError
from nvct.engines import configured
from nvct.engines.docker import dockerd_pid
from nvct.toolkit import standin

#: Programs the package installs that other configs name (matched as whole paths).
PROGRAMS = ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime.cdi",
            "/usr/bin/nvidia-container-runtime.legacy", "/usr/bin/nvidia-container-runtime-hook", "/usr/bin/nvct",
            "/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-ctk", "/usr/bin/nvidia-container-cli")
#: Files the deb and the rpm ship among ENGINE_FILES: removed with the package, never a leftover.
PACKAGE_FILES = ("/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json",)
_RESTART = {"docker": "restart dockerd", "containerd": "restart containerd", "crio": "restart cri-o"}
#: Engine configs checked for entries nvct did not write (the reference's, or hand-made).
ENGINE_FILES = ("/etc/docker/daemon.json", "/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml",
                "/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*", "/usr/share/containers/oci/hooks.d/*.json",
                "/etc/containers/oci/hooks.d/*.json")
#: The runtime programs (what engines record per container), and where their stand-ins wait for postrm.
RUNTIMES = PROGRAMS[:3]
STANDIN_DIR = "/run/nvct-standins"
#: The package's config, whose low-level runtimes the stand-ins pass calls to.
CONFIG = "/etc/nvidia-container-runtime/config.toml"
GENERATED_SPECS = "/var/run/cdi"
SPEC_DIRS = ("/etc/cdi",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--in-favour"]:
        replacement = argv[1] if len(argv) > 1 else "another package"
        _say(f"replaced by {replacement}, which provides the same programs: engine configs and CDI specs "
             "are left as they are")
        return 0

    dockers = [path for engine, path in configured.entries() if engine == "docker"]
    for line in undo_configured() + remove_generated_specs() + leftovers() + reload_dockerd(dockers) + \
            leave_standins():
        _say(line)
    return 0


def undo_configured() -> list[str]:
    """Unconfigure every config nvct configured; one line per config."""
    lines = []
    for engine, path in configured.entries():
        if not os.path.exists(runtimes.record_path(path)):
            configured.remove(path)  # unconfigured by other means
            continue
        try:
            if engine == "oci-hook":
                change = runtimes.unconfigure_hook(path)
            else:
                change = runtimes.unconfigure(engine, path)
        except NvctError as e:
            lines.append(f"could not undo the {engine} configuration in {path}: {e}; "
                         f"remove its NVIDIA runtime by hand")
            continue
        if change.keep_record:  # only an installer's changes (its own SIGTERM undoes them)
            continue
        lines += [f"{path}: {note}" if not note.startswith(path) else note for note in change.notes]
        if change.changed or change.record is None:  # else: it goes with a running installer's (a note says)
            restart = f" ({_RESTART[engine]} to apply)" if engine in _RESTART else ""
            lines.append(f"undid its configuration of {engine} in {path}{restart}")
    return lines


def remove_generated_specs() -> list[str]:
    """CDI specs in the runtime spec dir whose hooks run nvct's programs."""
    lines = []
    for path in sorted(glob.glob(os.path.join(GENERATED_SPECS, "*"))):
        if os.path.isfile(path) and _names_our_program(path):
            try:
                os.unlink(path)
            except OSError as e:
                lines.append(f"could not remove {path}: {e.strerror}")
                continue
            lines.append(f"removed {path} (a CDI spec whose hooks run nvct's programs)")
    return lines


def leftovers() -> list[str]:
    """Files outside nvct's undo records that still name its programs."""
    lines = []
    for pattern in ENGINE_FILES:
        for path in sorted(glob.glob(pattern)):
            if path in PACKAGE_FILES:
                continue
            program = _names_our_program(path)
            if program:
                lines.append(f"{path} still names {program}, which is removed with nvct: remove that entry "
                             "(or install the NVIDIA Container Toolkit, which provides it), then restart the engine")
    for directory in SPEC_DIRS:
        for path in sorted(glob.glob(os.path.join(directory, "*"))):
            program = _names_our_program(path)
            if program:
                lines.append(f"{path} is a CDI spec whose hooks run {program}, which is removed with nvct: "
                             f"delete it, or regenerate it with the toolkit that replaces nvct")
    return lines


def _names_our_program(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None
    words = set(_WORD.findall(text))
    for program in PROGRAMS:
        if program in words:
            return program
    if '"nvidia-container-runtime"' in text:  # docker's bare runtime path, as configure writes it
        return "nvidia-container-runtime"
    return None


#: A path as JSON, TOML and YAML write it: up to a quote, blank, comma, colon or bracket.
_WORD = re.compile(r"[^\s\"',:;=\[\]{}()]+")
#: The runtimes dockerd defines itself (what stays after a reload with a ``runtimes`` key).
_DOCKER_BUILTIN = ("runc",)


def reload_dockerd(configs: list[str]) -> list[str]:
    """Make the dockerd that reads one of ``configs`` stop using nvct's removed runtimes.

    dockerd 20.10 rereads ``runtimes`` and ``default-runtime`` on SIGHUP, but keeps the old value
    of a key the file lacks, and panics when the default it ends up with is no runtime it has. So
    it is reloaded only when the file makes the default a runtime that stays; otherwise one line
    says to restart it. ``$DOCKER_HOST`` (unix://) names its socket, as for the docker client.
    """
    host = os.environ.get("DOCKER_HOST", "")
    sock = host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"
    pid, _ = dockerd_pid(sock, "/var/run/docker.pid")
    if pid is None or not configs:
        return []
    config = _dockerd_config_file(pid)
    if os.path.realpath(config) not in {os.path.realpath(c) for c in configs}:
        return []
    try:
        info = _docker_get(sock, "/info")
        with open(config, "rb") as f:
            data = json.loads(f.read() or b"{}")
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as e:
        return [f"could not ask dockerd (pid {pid}) which runtimes it uses ({e}): {_restart()}"]
    running = info.get("Runtimes") or {}
    ours = sorted(name for name, entry in running.items() if _removed_program(str((entry or {}).get("path", "")))
                  and (not isinstance(data.get("runtimes"), dict) or name not in data["runtimes"]))
    if not ours:
        return []
    default = data.get("default-runtime", info.get("DefaultRuntime"))
    kept = set(data["runtimes"]) | set(_DOCKER_BUILTIN) if isinstance(data.get("runtimes"), dict) else set(running)
    if default in ours or default not in kept:
        return [f"dockerd (pid {pid}) still runs every container on the removed runtime "
                f"'{info.get('DefaultRuntime')}' until it restarts (a reload cannot change that here): "
                f"{_restart()}"]
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            now = _docker_get(sock, "/info")
        except (OSError, ValueError):
            now = {}
        if now.get("DefaultRuntime") == default and not set(ours) & set(now.get("Runtimes") or {}) - set(kept):
            left = sorted(set(ours) & set(now.get("Runtimes") or {}))
            tail = (f"; it keeps the removed runtime(s) {', '.join(left)} (docker run --runtime fails) "
                    f"until a restart: {_restart()}" if left else "")
            return [f"reloaded dockerd (pid {pid}): its default runtime is {default}{tail}"]
        time.sleep(0.1)
    return [f"dockerd (pid {pid}) did not take the reload; it may still run containers on nvct's removed "
            f"runtime: {_restart()}"]


def _removed_program(path: str) -> bool:
    """One of the package's programs, by path or by the bare name docker looks up on PATH."""
    return path in PROGRAMS or ("/" not in path and f"/usr/bin/{path}" in PROGRAMS)


def _restart() -> str:
    return "run: systemctl restart docker" if os.path.isdir("/run/systemd/system") else "restart dockerd"


def _dockerd_config_file(pid: int) -> str:
    """dockerd's ``--config-file`` (its default when not given)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return ""
    for i, arg in enumerate(args):
        if arg == "--config-file" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config-file="):
            return arg.partition("=")[2]
    return "/etc/docker/daemon.json"


def _docker_get(sock: str, path: str) -> dict:
    """``GET path`` on dockerd's API socket: the JSON body."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(sock)
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if status.split()[1:2] != ["200"]:
        raise ValueError(f"GET {path}: {status or 'no answer'}")
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError(f"GET {path}: not a JSON object")
    return data


def leave_standins() -> list[str]:
    """Stand-ins for the runtime programs running containers still name, for postrm to put in place."""
    needed = standin.referencing(list(RUNTIMES))
    if not needed:
        return []
    runtimes = standin.config_runtimes(CONFIG, ("docker-runc", "runc", "crun"))  # the reference's default
    lines = []
    for path, pids in sorted(needed.items()):
        target = os.path.join(STANDIN_DIR, os.path.basename(path))
        try:
            os.makedirs(STANDIN_DIR, mode=0o755, exist_ok=True)
            with open(target + ".tmp", "w", encoding="utf-8") as f:
                f.write(standin.script(path, runtimes))
            os.chmod(target + ".tmp", 0o755)
            os.replace(target + ".tmp", target)
        except OSError as e:
            lines.append(f"could not leave a stand-in for {path} ({e.strerror}): containers still running on it "
                         f"(shim pids {', '.join(map(str, pids))}) cannot be stopped through their engine")
            continue
        lines.append(f"{path}: a stand-in takes its place for the containers still running on it (shim pids "
                     f"{', '.join(map(str, pids))}), so they can be stopped and deleted; it goes with the last "
                     f"of them")
    return lines


def _say(line: str) -> None:
    sys.stdout.write(f"nvct: {line}\n")


if __name__ == "__main__":
    sys.exit(main())
