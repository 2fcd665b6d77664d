"""``nvidia-container-runtime``: the shim docker and containerd call instead of runc.

Only ``create`` (and ``run``) of a container that asks for a GPU touches the
spec; every other call execs the low-level runtime at once with its argv
unchanged. The installed program is a POSIX sh front
(nvct/scripts/launcher) that does those other calls itself,
from the runtime this module records; in legacy mode it also appends the
prestart hook this module records for it. Heavy modules are imported only
after the spec shows a GPU request.
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str] | None = None, *, banner: bool = True) -> int:
    """``banner=False``: the sh front printed ``--version``'s nvct lines already."""
    # A short life that ends in exec: the cyclic collector's passes over the imports and the
    # spec (8 of them, ≈ 1.2 ms of a GPU create's ≈ 17 ms CPU, docs/performance.md) free nothing
    # that matters.
    import gc

    gc.disable()
    argv = sys.argv[1:] if argv is None else argv
    start = time.monotonic()
    from nvct.base.errors import ConfigError, NvctError
    from nvct.oci import runcargs

    args = runcargs.parse(argv)
    if banner and args.subcommand is None and runcargs.asks_version(argv):
        from nvct.programs.version import runtime_banner

        sys.stdout.write(runtime_banner())
        sys.stdout.flush()
    try:
        from nvct.config import file as config_mod
        from nvct.oci import runtime as lowlevel

        path = config_mod.default_path()
        seen = lowlevel.identity(path)  # before reading: an edit while we read is noticed next time
        try:
            config = config_mod.load()
        except ConfigError as e:
            runtime = _despite_broken_config(args, path, e)
        else:
            _force_mode_by_name(config)
            if config.mode == "legacy" and config.raw is not None:
                from nvct.base import parsecache

                parsecache.keep(config.raw)  # for the hook (nvct.config.file.load): not kept, it reads the file
            runtime = lowlevel.find(config.runtimes)
            from nvct.request.container import request_markers

            _cache_problem(config, lowlevel.remember(path, seen, request_markers(config), runtime,
                                                     _legacy_record(config)))
            if args.subcommand in ("create", "run"):
                after = _create(args, config, start, runtime)
                if after is not None:
                    _exit(_create_then(runtime, argv, args, after))
    except NvctError as e:
        _fail(args, str(e))
        return 1
    except Exception as e:  # noqa: BLE001 - never a traceback in docker's error line
        _fail(args, f"internal error: {type(e).__name__}: {e}")
        return 1
    lowlevel.execv(runtime, argv)
    return 1  # not reached


#: ``nvidia-container-runtime.<suffix>``: the reference's per-mode programs (links to this one).
_MODE_SUFFIXES = {"cdi": "cdi", "legacy": "legacy"}


def _force_mode_by_name(config) -> None:
    """Called as ``nvidia-container-runtime.cdi`` or ``.legacy``: that mode, whatever the config says."""
    name = sys.argv[0].rpartition("/")[2]
    base, dot, suffix = name.rpartition(".")
    if dot and base == "nvidia-container-runtime" and suffix in _MODE_SUFFIXES:
        config.data["nvidia-container-runtime"]["mode"] = _MODE_SUFFIXES[suffix]


def _legacy_record(config) -> tuple[str, dict[str, str]] | None:
    """In legacy mode, the hook this program's sh front may append itself (see nvct.oci.runtime)."""
    program = sys.argv[0] if sys.argv else ""
    if config.mode != "legacy" or "\t" in program or "\n" in program:
        return None
    from nvct.modifier.modes import legacy_record

    hook = legacy_record(config, program)
    return (program, hook) if hook else None


def _cache_problem(config, problem: str | None) -> None:
    """A cache in /run/nvct that cannot be written: every call then starts Python; say why."""
    from nvct.base import parsecache

    problems = [p for p in (problem, *parsecache.problems) if p]
    if not problems or not config.runtime_debug:
        return
    from nvct.base import log

    log.setup(config.runtime_log_level or "info", config.runtime_debug)
    for p in problems:
        log.logger.debug("cache not used, every call starts Python: %s", p)


def _create(args, config, start: float, runtime: str):
    """The spec and root prepared; the hook steps left for after the runtime's create
    (nvct.modifier.prepare.Plan.after_create), or None: exec the runtime."""
    from nvct.oci import spec as ocispec
    from nvct.request import container as request_mod

    raw = ocispec.read_raw(args.bundle)
    if not request_mod.might_request_gpu(raw, config):
        return
    spec = ocispec.load(args.bundle, raw)
    request = request_mod.from_spec(spec, config)
    if not request.is_gpu:
        return
    from nvct.base import log
    from nvct.modifier import modes

    log.setup(config.runtime_log_level or "info",
              config.runtime_debug, fmt=args.log_format or "text")
    typos = config.unknown_keys_warning()
    result = None
    try:
        result = modes.modify(spec, request, config, log_format=args.log_format, bundle=args.bundle,
                              runtime=runtime, prepare="write")
    finally:
        # A typo may be why the start fails; in legacy mode the hook logs it (once per start).
        if typos and (result is None or result.mode != "legacy"):
            log.logger.warning("%s", typos)
    _still_there(result)
    after = result.plan.after_create(spec, args.subcommand) if result.plan is not None else None
    _save(args.bundle, spec, result.plan)
    log.logger.info("container start", fields={
        "id": args.container_id, "mode": result.mode, "devices": list(result.devices),
        "capabilities": list(request.capabilities),
        "ms": round((time.monotonic() - start) * 1000, 1),
    })
    if after is not None:
        log.logger.debug("the params mask by the shim after the runtime's create, no hook")
    return after


#: Signals the shim passes on to the runtime's create while it waits (as if it were the runtime).
_FORWARDED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGWINCH")


def _create_then(runtime: str, argv: list[str], args, after) -> int:
    """The runtime's ``create`` as a child, then ``after``'s steps in the created container.

    The child gets this call's argv, stdio and fds, as the exec would: the engine's
    --pid-file and --console-socket work as before. Its init then waits on the exec
    fifo, having run no image code. A failed step deletes the container: it never
    starts without its mask. Killed meanwhile, the shim leaves a created container,
    which the engine deletes with the failed create.
    """
    import signal

    from nvct.base.errors import NvctError
    from nvct.oci import environ as hookenv

    signals = [getattr(signal, name) for name in _FORWARDED]
    child: list[int] = []

    def forward(signum, _frame) -> None:
        if child:
            try:
                os.kill(child[0], signum)
            except OSError:
                pass

    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    handlers = {signum: signal.signal(signum, forward) for signum in signals
                if signal.getsignal(signum) != signal.SIG_IGN}
    try:
        child.append(os.posix_spawn(runtime, [runtime, *argv], hookenv.caller_environ(), setsigmask=old_mask))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        code = os.waitstatus_to_exitcode(os.waitpid(child[0], 0)[1])
    finally:
        for signum, handler in handlers.items():  # the steps are the shim's own: a signal ends it
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    if code:
        return code if code > 0 else 128 - code
    try:
        after.run(_init_pid(runtime, args))
    except NvctError as e:
        _delete(runtime, args)
        _fail(args, f"{e}; container {args.container_id} deleted")
        return 1
    except BaseException as e:  # noqa: BLE001 - one line, and no container left without its mask (SIGINT too)
        _delete(runtime, args)
        _fail(args, f"internal error: {type(e).__name__}: {e}; container {args.container_id} deleted")
        return 1
    return 0


def _exit(code: int) -> None:
    """The end of a create the shim waited for: as the exec it replaces, without the interpreter's
    teardown of every module and object (the log's records are flushed as written)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _init_pid(runtime: str, args) -> int:
    """The created container's init: from the engine's --pid-file, else the runtime's ``state``."""
    from nvct.base.errors import ContainerError

    try:
        if args.pid_file:
            with open(args.pid_file) as f:
                text = f.read().strip()
        else:
            text = _state_pid(runtime, args)
    except OSError as e:
        raise ContainerError(f"container {args.container_id}: its init's pid: {e.strerror}") from None
    if not text.isdigit() or int(text) <= 1:
        raise ContainerError(f"container {args.container_id}: no init pid from the runtime ({text!r})")
    return int(text)


def _state_pid(runtime: str, args) -> str:
    """The init pid in ``<runtime> state``'s JSON (nothing else of it is read)."""
    from nvct.base import jsoncodec

    out = _call_runtime(runtime, args, "state", args.container_id or "")
    try:
        state = jsoncodec.loads(out.decode(errors="replace"))
    except ValueError:
        return ""
    value = state.get("pid") if isinstance(state, dict) else None
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else ""


def _delete(runtime: str, args) -> None:
    """``<runtime> delete --force``: a container whose steps failed never starts."""
    if args.container_id:
        _call_runtime(runtime, args, "delete", "--force", args.container_id)


def _call_runtime(runtime: str, args, *verb: str) -> bytes:
    """``<runtime> <this call's global options> VERB...`` to its end: its stdout. Its stdin and
    stderr are /dev/null: what it says is not the engine's to read."""
    from nvct.oci import environ as hookenv

    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    rfd, wfd = os.pipe()
    try:
        pid = os.posix_spawn(runtime, [runtime, *args.options, *verb], hookenv.caller_environ(),
                             file_actions=[(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, wfd, 1),
                                           (os.POSIX_SPAWN_DUP2, null, 2), (os.POSIX_SPAWN_CLOSE, rfd)])
    finally:
        os.close(wfd)
        os.close(null)
    with os.fdopen(rfd, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def _still_there(result) -> None:
    """Every host file the edits mount is still there: else the driver changed during the start.

    A driver upgrade replaces its libraries while containers start. Found
    gone now, it is one line naming the file, not the runtime's mount error
    later; not a second discovery, which would give the container the new
    libraries while the old kernel module is still loaded (NVML's
    "driver/library version mismatch" inside it).
    """
    for mount in result.edits.mounts:
        if mount.type in (None, "bind", "rbind") and mount.host_path.startswith("/") \
                and not os.path.exists(mount.host_path):
            if result.plan is not None:
                result.plan.root.close()
            from nvct.base.errors import DriverError

            raise DriverError(f"{mount.host_path}: gone while the container was being created: the driver "
                              "changed during the start (an upgrade?); start the container again")


def _save(bundle: str, spec, plan) -> None:
    """The spec saved and ``plan`` written into the root, in the order a failure or kill leaves safe.

    The spec is written first under a temporary name beside config.json (a
    full bundle fails here, naming it, with the root untouched), then the
    masked params, then the root; config.json is replaced last, by one
    rename. A kill before that rename leaves the old spec, which a retried
    create prepares afresh (the root's writes are the same again), and a
    temporary that the next write into the bundle removes.
    """
    from nvct.base import fileutil, jsoncodec
    from nvct.base.errors import SpecError
    from nvct.oci import spec as ocispec

    path = ocispec.config_path(bundle)
    try:
        staged = fileutil.Staged(path, jsoncodec.dumps(spec, compact=True).encode())
    except OSError as e:
        if plan is not None:
            plan.root.close()
        raise SpecError(f"{path}: cannot save the container's spec: {e.strerror or e}") from None
    try:
        if plan is not None:
            plan.write()
        try:
            staged.commit()
        except OSError as e:
            raise SpecError(f"{path}: cannot save the container's spec: {e.strerror or e}") from None
    finally:
        staged.discard()


def _despite_broken_config(args, path: str, error: Exception) -> str:
    """The runtime for a call under a config file that cannot be read.

    A container that asks for no GPU must not be stopped by a typo on a node
    where ``nvidia`` is the default runtime; a GPU container gets the error.
    The runtime is the one last recorded for this config (what its
    containers were created with, so start/delete/state reach them), else
    the default list's first. Logged as a warning on stderr and in runc's log.
    """
    from nvct.config import file as config_mod
    from nvct.oci import runtime as lowlevel

    if args.subcommand in ("create", "run") and _asks_for_gpu(args):
        raise error
    runtime = lowlevel.last_known(path) or lowlevel.find(config_mod.Config(None).runtimes)
    message = f"nvidia-container-runtime: warning: {error}; running {runtime} without GPU support"
    from nvct.base import log

    sys.stderr.write(message + "\n")
    log.write_runc_log(args.log, "warning", message)
    return runtime


def _asks_for_gpu(args) -> bool:
    """Whether the spec requests a GPU by env, mounts or annotations, read with the default config."""
    from nvct.config import file as config_mod
    from nvct.oci import spec as ocispec
    from nvct.request import container as request_mod

    defaults = config_mod.Config(None)
    raw = ocispec.read_raw(args.bundle)
    if not request_mod.might_request_gpu(raw, defaults):
        return False
    try:
        return request_mod.from_spec(ocispec.load(args.bundle, raw), defaults).is_gpu
    except Exception:  # noqa: BLE001 - a request we cannot read may be a GPU request
        return True


def _fail(args, message: str) -> None:
    from nvct.base import log

    sys.stderr.write(f"nvidia-container-runtime: {message}\n")
    log.write_runc_log(args.log, "error", f"nvidia-container-runtime: {message}")
    try:
        from nvct.config import file as config_mod

        log.setup("info", config_mod.load().runtime_debug)
        log.logger.error("%s", message)
    except Exception:  # noqa: BLE001 - the error itself may be a bad config
        pass


if __name__ == "__main__":
    sys.exit(main())
