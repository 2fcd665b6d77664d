"""Running commands and private daemons for the container tests.

Every daemon the tests start is *ours* by construction: it is our child,
its pid is recorded, and its command line names a private directory. Cleanup
only ever signals such pids -- never a process found by its name.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

#: PATH for daemons and clients: Debian's binaries first (a /usr/local/bin
#: docker CLI shadows Debian's on this kind of machine).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"


@dataclass
class Result:
    """What one command (a runtime, a client) did."""

    rc: int
    stdout: str
    stderr: str
    log: str = ""
    argv: Sequence[str] = ()
    duration: float = 0.0
    timings: dict = field(default_factory=dict)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    def check(self) -> "Result":
        """Return self, or fail with everything needed to see why."""
        if not self.ok:
            raise AssertionError(f"command failed: {self.describe()}")
        return self

    def describe(self) -> str:
        parts = [f"rc={self.rc}{' (timed out)' if self.timed_out else ''}",
                 f"argv={list(self.argv)}",
                 f"stdout={self.stdout!r}", f"stderr={self.stderr!r}"]
        if self.log:
            parts.append(f"log={self.log!r}")
        return " ".join(parts)


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
        timeout: float = 60, cwd: str | None = None,
        input: str | None = None, on_timeout=None) -> Result:
    """Run ``argv`` to completion (stdin /dev/null unless ``input``).

    A command that outlives ``timeout`` is killed with its whole process
    group and reported as ``timed_out`` rather than raising; ``on_timeout()``
    then gets to kill what escaped the group (a container holding our pipes).
    """
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv), env=None if env is None else dict(env), cwd=cwd,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(input.encode() if input is not None else None,
                                    timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        if on_timeout is not None:
            on_timeout()
        out, err = _drain(proc)
        timed_out = True
    return Result(rc=proc.returncode, stdout=out.decode(errors="replace"),
                  stderr=err.decode(errors="replace"), argv=list(argv),
                  duration=time.monotonic() - start, timed_out=timed_out)


def wait_exact(proc: subprocess.Popen, timeout: float) -> int:
    """``proc.wait(timeout)`` that returns when the process exits, for timings.

    Popen.wait with a timeout polls in doubling sleeps capped at 50 ms, so a
    command timed through it reads 31.5, 63.5, 113.5 ms...; a pidfd wakes at
    the exit itself. Raises TimeoutExpired like Popen.wait.
    """
    fd = os.pidfd_open(proc.pid)
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    return proc.wait()


def _drain(proc: subprocess.Popen) -> tuple[bytes, bytes]:
    # Grandchildren may still hold the pipes open: don't wait for them forever.
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
        proc.wait()
        return b"", b""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def unique_id(prefix: str = "nvct") -> str:
    """A container/pod id no other test (or test run) will pick."""
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"


def short_tempdir(prefix: str) -> str:
    """A private directory with a short path: unix sockets go in it (108 bytes max)."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def daemon_dirs(daemon, short: str, name: str, config_name: str, *, path_prefix: Sequence[str] = (),
                extra_env: Mapping[str, str] | None = None) -> str:
    """Private dirs and env of a test daemon, set on ``daemon``: state_dir (short, for sockets),
    data_root, socket, config_file, pidfile, log_path and env. Returns its home dir."""
    daemon.state_dir = short_tempdir(f"nvct-{short}-")
    daemon.data_root = tempfile.mkdtemp(prefix=f"nvct-{name}-data-")
    daemon.socket = os.path.join(daemon.state_dir, f"{name}.sock")
    daemon.config_file = os.path.join(daemon.state_dir, config_name)
    daemon.pidfile = os.path.join(daemon.state_dir, f"{name}.pid")
    daemon.log_path = os.path.join(daemon.state_dir, f"{name}.log")
    home = os.path.join(daemon.state_dir, "home")
    os.makedirs(home)
    daemon.env = minimal_env(home, path_prefix=path_prefix, extra=extra_env)
    return home


def minimal_env(home: str, *, path_prefix: Sequence[str] = (),
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The fixed environment daemons get (``env -i PATH=... HOME=... LANG=...``)."""
    env = {"PATH": ":".join([*path_prefix, SYSTEM_PATH]), "HOME": home,
           "LANG": "C.UTF-8"}
    env.update(extra or {})
    return env


def start_daemon(argv: Sequence[str], *, env: Mapping[str, str],
                 log_path: str) -> subprocess.Popen:
    """Start ``argv`` in its own session, cwd /, stdin /dev/null, output to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), env=dict(env), cwd="/",
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)


def read_pidfile(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` (not necessarily our child) has exited."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]  # Linux only
    except (AttributeError, OSError):
        fd = None
    try:
        while alive(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if fd is not None:
                select.select([fd], [], [], min(left, 0.5))
            else:
                time.sleep(min(left, 0.02))
        return True
    finally:
        if fd is not None:
            os.close(fd)


def stop_pid(pid: int, *, timeout: float = 20, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to ``pid``, escalate to SIGKILL after ``timeout``."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    if not wait_gone(pid, timeout):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        wait_gone(pid, 5)


def pids_referencing(path: str) -> list[int]:
    """Live processes whose command line names ``path`` (a private path of ours)
    or something below it."""
    found = []
    me = os.getpid()
    pattern = re.compile(re.escape(path.rstrip("/").encode()) + rb"(?=[/\x00]|$)")
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if pattern.search(cmdline) and alive(int(entry)):
            found.append(int(entry))
    return found


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    path = os.path.realpath(path)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = _unescape_mountinfo(line.split()[4])
            if point == path or point.startswith(path + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _unescape_mountinfo(field_: str) -> str:
    return (field_.replace("\\040", " ").replace("\\011", "\t")
            .replace("\\012", "\n").replace("\\134", "\\"))


_MNT_DETACH = 2


def unmount_under(path: str) -> None:
    """Lazily unmount everything a daemon left mounted below ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    for point in mounts_under(path):
        libc.umount2(point.encode(), _MNT_DETACH)


def remove_tree(path: str) -> None:
    """Remove a private directory after unmounting what daemons left in it."""
    if not os.path.lexists(path):
        return
    unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        # Immutable files or busy mounts: make the leak visible, not fatal.
        subprocess.run(["rm", "-rf", "--one-file-system", path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_for(predicate, what: str, timeout: float = 30, interval: float = 0.05, detail=None):
    """Poll ``predicate`` until it returns something true, and return that; the synchronisation of tests.

    Fails the test with ``what`` (and ``detail()``, e.g. a daemon's log, when given) if
    ``timeout`` seconds pass first. Never a sleep of a guessed length in its place.
    """
    value = None

    def _holds():
        nonlocal value
        value = predicate()
        return value

    if wait_until(_holds, timeout, interval):
        return value
    raise AssertionError(f"{what}: not within {timeout:g} s" + (f"\n{detail()}" if detail else ""))
