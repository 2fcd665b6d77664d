"""``nvidia-container-runtime-hook``: the prestart hook of legacy mode and ``docker --gpus``.

``prestart`` reads the OCI state on stdin, resolves request + driver ->
edits, and realizes them inside the container; ``poststart`` and
``poststop`` have nothing to do. The environment is never the image's
(docker gives dockerd's, hooks.d and the shim give a fixed one), and it is
sanitized anyway before anything runs.
"""

from __future__ import annotations

import os
import sys
import time

#: nvct.modifier.modes.CONFIG_DIGEST_ENV (not imported: modes costs imports the hook's start need not pay).
CONFIG_DIGEST_ENV = "NVCT_CONFIG_DIGEST"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from nvct.linux import privileges

    privileges.sanitize_environ()
    if any(a.split("=", 1)[0] in ("-version", "--version") for a in argv):
        from nvct.programs.version import banner

        sys.stdout.write(banner("nvidia-container-runtime-hook"))
        return 0
    stage = next((a for a in argv if not a.startswith("-")), None)
    if stage in ("poststart", "poststop"):
        from nvct.hooks.container import drain

        drain(sys.stdin)  # crun fails the start when a hook exits before it wrote the state
        return 0
    if stage != "prestart":
        sys.stderr.write("usage: nvidia-container-runtime-hook [--config FILE] prestart|poststart|poststop\n")
        return 2
    from nvct.base.errors import NvctError

    try:
        _prestart(_option(argv, "--config"))
    except NvctError as e:
        _fail(str(e))
        return 1
    except Exception as e:  # noqa: BLE001 - the runtime shows stderr: one line, no traceback
        _fail(f"internal error: {type(e).__name__}: {e}")
        return 1
    return 0


def _fail(message: str) -> None:
    from nvct.base.log import logger

    sys.stderr.write(f"nvidia-container-runtime-hook: {message}\n")
    logger.error("%s", message)


def _prestart(config_path: str | None) -> None:
    start = time.monotonic()
    from nvct.base import log
    from nvct.config import file as config_mod
    from nvct.hooks.container import read_state
    from nvct.modifier import legacy as realize
    from nvct.oci import runtime as lowlevel, spec as ocispec
    from nvct.request import container as request_mod

    path = config_path or config_mod.default_path()
    # Legacy mode: the config the shim decided with (its kept copy), never a second read.
    digest = os.environ.get(CONFIG_DIGEST_ENV)
    if digest:
        config, problem = config_mod.load(config_path, digest=digest), None
    else:
        seen = lowlevel.identity(path)  # before reading, as the shim does
        config = config_mod.load(config_path)
        # The names the hooks.d front greps for under this config (it never works them out itself).
        problem = lowlevel.remember(path, seen, request_mod.request_markers(config))
    log.setup(config.runtime_log_level or "info",
              config.cli_debug or config.runtime_debug,
              fmt="json" if os.environ.get("NVCT_LOG_FORMAT") == "json" else "text")
    if problem:
        log.logger.debug("cache not used, every call starts Python: %s", problem)
    state = read_state(sys.stdin)
    bundle = state.get("bundle") or state.get("bundlePath")
    if not bundle:
        from nvct.base.errors import SpecError

        raise SpecError("OCI state on stdin names no bundle")
    spec = ocispec.load(bundle)
    request = request_mod.from_spec(spec, config)
    if not request.is_gpu:
        log.logger.debug("no GPU requested; nothing to do")
        return
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        from nvct.base.errors import SpecError

        raise SpecError("OCI state on stdin has no container pid")
    typos = config.unknown_keys_warning()
    if typos:
        log.logger.warning("%s", typos)
    result = realize.legacy(request, config, spec, bundle, pid)
    log.logger.info("container start", fields={
        "id": state.get("id"), "mode": "legacy-hook", "devices": list(request.devices or ()),
        "capabilities": list(request.capabilities), "nodes": len(result.device_nodes),
        "mounts": len(result.mounts), "ms": round((time.monotonic() - start) * 1000, 1),
    })


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
