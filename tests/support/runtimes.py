"""Running bundles with an OCI runtime (runc, crun, or nvct's shim in front of one).

Every call uses a private ``--root`` state directory unless given one, and
always leaves nothing behind: the container is force-deleted even when the
run failed or timed out.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, Mapping, Sequence

from .proc import Result, read_pidfile, run, short_tempdir, unique_id, wait_exact

RUNC = "/usr/sbin/runc"
CRUN = "/usr/bin/crun"
#: name -> argv prefix of each supported low-level runtime.
RUNTIMES = {"runc": [RUNC], "crun": [CRUN]}


def run_container(runtime_argv: Sequence[str], bundle: str | os.PathLike,
                  container_id: str | None = None, *, root: str | None = None,
                  timeout: float = 30, log_file: str | None = None,
                  env: Mapping[str, str] | None = None) -> Result:
    """``<runtime> --root R [--log F --log-format json] run --bundle B ID``.

    stdin is /dev/null, cwd is the bundle (as under docker). ``result.log``
    holds the ``--log`` file's content.
    """
    bundle = os.path.abspath(os.fspath(bundle))
    cid = container_id or unique_id()
    with _state_root(root) as state:
        base = _base_argv(runtime_argv, state, log_file)
        try:
            result = run([*base, "run", "--bundle", bundle, cid], env=env,
                         timeout=timeout, cwd=bundle,
                         on_timeout=lambda: _force_delete(base, cid, env))
        finally:
            _force_delete(base, cid, env)
    result.log = _read(log_file)
    return result


def create_start_delete(runtime_argv: Sequence[str], bundle: str | os.PathLike,
                        container_id: str | None = None, *, root: str | None = None,
                        timeout: float = 30, log_file: str | None = None,
                        env: Mapping[str, str] | None = None) -> Result:
    """create -> start -> wait for exit -> delete, each step timed (for benchmarks).

    ``result.timings`` has ``create``, ``start``, ``wait``, ``delete`` and
    ``total`` in seconds; ``result.rc`` is the container's exit status (or
    the failing step's). We are child subreaper for the duration, so the
    container's init becomes our child and its exit status is ours to read.
    """
    bundle = os.path.abspath(os.fspath(bundle))
    cid = container_id or unique_id()
    timings: dict[str, float] = {}
    scratch = tempfile.mkdtemp(prefix="nvct-csd-")
    out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
    steps: list[Result] = []
    rc = -1
    timed_out = False
    try:
        with _state_root(root) as state, _subreaper():
            base = _base_argv(runtime_argv, state, log_file)
            try:
                pidfile = os.path.join(scratch, "pid")
                with open(out_path, "wb") as out, open(err_path, "wb") as err:
                    t0 = time.monotonic()
                    try:
                        proc = subprocess.Popen(
                            [*base, "create", "--bundle", bundle, "--pid-file", pidfile,
                             cid], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            cwd=bundle, env=None if env is None else dict(env))
                        try:
                            rc = wait_exact(proc, timeout)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
                            raise
                    except subprocess.TimeoutExpired:
                        rc, timed_out = -1, True
                timings["create"] = time.monotonic() - t0
                if rc == 0:
                    rc, timed_out = _start_and_wait(base, cid, read_pidfile(pidfile), env,
                                                    timeout, timings, steps)
            finally:
                exited = "wait" in timings and not timed_out
                if exited:
                    t0 = time.monotonic()
                    steps.append(run([*base, "delete", cid], env=env, timeout=timeout))
                    timings["delete"] = time.monotonic() - t0
                if not exited or not steps[-1].ok:
                    _force_delete(base, cid, env)
        timings["total"] = sum(timings.values())
        stderr = _read(err_path) + "".join(s.stderr for s in steps if not s.ok)
        return Result(rc=rc, stdout=_read(out_path), stderr=stderr, log=_read(log_file),
                      argv=[*runtime_argv, "create/start/delete", cid],
                      duration=timings["total"], timings=timings, timed_out=timed_out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _start_and_wait(base: list[str], cid: str, pid: int, env, timeout: float,
                    timings: dict, steps: list) -> tuple[int, bool]:
    t0 = time.monotonic()
    start = run([*base, "start", cid], env=env, timeout=timeout)
    timings["start"] = time.monotonic() - t0
    steps.append(start)
    if not start.ok:
        _force_delete(base, cid, env)
        _reap(pid, 5)
        return start.rc, start.timed_out
    t0 = time.monotonic()
    status = _reap(pid, timeout)
    timings["wait"] = time.monotonic() - t0
    if status is None:
        _force_delete(base, cid, env)
        _reap(pid, 5)
        return -1, True
    return status, False


def _reap(pid: int, timeout: float) -> int | None:
    """Exit status of our (adopted) child ``pid``, or None if it outlived ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]  # Linux only
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return -1  # not adopted (runtime without a plain fork): status unknown
            if done:
                return os.waitstatus_to_exitcode(status)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if fd is not None:
                select.select([fd], [], [], min(left, 0.5))
            else:
                time.sleep(min(left, 0.005))
    finally:
        if fd is not None:
            os.close(fd)


_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    old = ctypes.c_int(0)
    libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(old), 0, 0, 0)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, old.value, 0, 0, 0)


@contextlib.contextmanager
def _state_root(root: str | None) -> Iterator[str]:
    if root is not None:
        yield root
        return
    private = short_tempdir("nvct-rt-")
    try:
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _base_argv(runtime_argv: Sequence[str], root: str, log_file: str | None) -> list[str]:
    argv = [*runtime_argv, "--root", root]
    if log_file:
        argv += ["--log", log_file, "--log-format", "json"]
    return argv


def _force_delete(base: list[str], cid: str, env) -> None:
    # Without --log: "container does not exist" must not land in the caller's log.
    if "--log" in base:
        base = base[:base.index("--log")]
    run([*base, "delete", "--force", cid], env=env, timeout=30)


def _read(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""
