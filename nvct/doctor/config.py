"""nvct's own config: that it loads, that its roots exist, and what the shim will run."""

from __future__ import annotations

import os
import re
import subprocess

from nvct.base.errors import NvctError
from nvct.doctor import devices
from nvct.doctor.model import Context, fail, info, ok, warn
from nvct.edits.build import hook_source
from nvct.modifier.modes import legacy_hook_path
from nvct.oci import runtime as lowlevel
from nvct.rootfs import ldconfig


def check_file(ctx: Context):
    path = ctx.config_file
    if ctx.config_error:
        line = re.search(r"line (\d+)", ctx.config_error)
        where = f"line {line.group(1)} of {path}" if line else path
        yield fail("config.file", ctx.config_error,
                   f"correct {where}, then check it with: nvct config show -c {path}")
        return
    if ctx.config.path is None:
        yield info("config.file", f"no {path}: nvct uses its built-in defaults",
                   f"to write one: nvct config default -o {path}")
        return
    yield ok("config.file", f"{path} loads (mode {ctx.config.mode})")
    typos = ctx.config.unknown_keys()
    if typos:
        yield warn("config.keys", f"{path}: unknown key{'s' if len(typos) > 1 else ''} "
                   f"{', '.join(repr(k) for k in typos)}, ignored: a typo leaves its setting at the default",
                   f"correct or remove {'them' if len(typos) > 1 else 'it'} in {path} "
                   "('nvct config default' lists every key)")


def check_roots(ctx: Context):
    if ctx.config is None:
        yield ctx.skipped("config.roots", "nvct's config does not load (see config.file)")
        return
    config = ctx.config
    bad = False
    implicit_dev = config.dev_root_source.startswith("the driver root")
    for what, key, root, inside, holds in (
            ("driver root", "nvidia-container-cli.root", config.driver_root, "usr", "the driver's files"),
            ("dev root", "nvct.dev-root", config.dev_root, "dev", "the driver's dev/ nodes"),
            ("proc root", "nvct.proc-root", config.proc_root, None, "the host's /proc")):
        shown = config.dev_root_source if key == "nvct.dev-root" and implicit_dev else key
        if not os.path.isdir(root):
            if not (bad and implicit_dev and key == "nvct.dev-root"):  # the driver root's failure says it
                yield fail("config.roots", f"{what} {root} ({shown}) does not exist",
                           ctx.set_command(key, "<directory>") + f" (where {holds} are)")
            bad = True
        elif inside and not os.path.isdir(os.path.join(root, inside)):
            bad = True
            host_nodes = implicit_dev and _other_dev(ctx, root)
            yield fail("config.roots", f"{what} {root} ({shown}) has no {inside}/",
                       ctx.set_command(key, "/" if host_nodes else "<directory>")
                       + (" (the nodes are in the host's /dev)" if host_nodes else ""))
    if not bad and ctx.empty_driver_root:
        bad = True
        yield _empty_driver_root(ctx)
    if not bad:
        yield ok("config.roots", f"driver root {config.driver_root}, dev root {config.dev_root} "
                 f"({config.dev_root_source}), proc root {config.proc_root}{_other_dev(ctx, config.dev_root)}")


def _empty_driver_root(ctx: Context):
    """The driver root holds nothing of the loaded driver: name the setting, and where the driver is."""
    key, version = "nvidia-container-cli.root", ctx.version
    seen = (f"{ctx.empty_driver_root} (no libnvidia-ml.so.{version} or libcuda.so.{version}), but the kernel "
            f"module is {version}: GPU containers get their device nodes but no driver libraries and no nvidia-smi")
    elsewhere = ctx.driver_root_elsewhere()
    if elsewhere:
        return fail("config.roots", f"{seen}; driver {version} is installed under {elsewhere}",
                    ctx.set_command(key, elsewhere))
    return fail("config.roots", seen, ctx.set_command(key, "<directory>") + " (where the driver is installed; "
                f"a driver container's is /run/nvidia/driver), or install driver {version}'s libraries")


def _other_dev(ctx: Context, dev_root: str) -> str:
    """A note when the host's /dev also holds the NVIDIA nodes, which nvct then does not use."""
    if os.path.normpath(dev_root) == os.path.normpath(devices.HOST_ROOT) or ctx.driver is None:
        return ""
    try:
        control = ctx.driver.control_nodes()[:1]
    except NvctError:
        return ""
    if not control or not devices.in_host_dev(control):
        return ""
    return "; the host's /dev also holds NVIDIA nodes, which nvct does not use (see docs/configuration.md)"


def check_runtimes(ctx: Context):
    """The low-level runtime the shim execs."""
    if ctx.config is None:
        yield ctx.skipped("config.runtimes", "nvct's config does not load (see config.file)")
        return

    try:
        path = lowlevel.find(ctx.config.runtimes)
    except NvctError as e:
        yield fail("config.runtimes", str(e),
                   "apt-get install runc (or: " + ctx.set_command("nvidia-container-runtime.runtimes",
                                                                  "/usr/sbin/runc") + ")")
        return
    yield ok("config.runtimes", f"the shim runs {path}")
    version = _runc_version(path)
    if version and version < _RUNC_FIXED:
        shown = ".".join(map(str, version))
        yield warn("config.runtime-cve", f"{path} is runc {shown}, open to CVE-2024-45310 (a volume-swap race "
                   "creates empty files on the host; fixed in runc 1.1.14)",
                   "upgrade runc to 1.1.14 or newer, or use crun: "
                   + ctx.set_command("nvidia-container-runtime.runtimes", "/usr/bin/crun"))


#: The first runc without CVE-2024-45310.
_RUNC_FIXED = (1, 1, 14)


def _runc_version(path: str) -> tuple[int, ...] | None:
    """runc's version from ``runc --version`` ("runc version 1.1.5+ds1"); None for other runtimes."""
    if "runc" not in os.path.basename(path):
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^runc version (\d+)\.(\d+)\.(\d+)", out, re.M)
    return tuple(int(x) for x in match.groups()) if match else None


def check_hook(ctx: Context):
    """The executable the configured mode puts into containers' hooks."""
    if ctx.config is None:
        yield ctx.skipped("config.hook", "nvct's config does not load (see config.file)")
        return
    if ctx.config.mode == "legacy":
        path, key = legacy_hook_path(ctx.config), "nvidia-container-runtime-hook.path"
    else:
        try:
            path, key = hook_source(ctx.config)
        except NvctError as e:
            key = str(e).partition(":")[0] if str(e).startswith(("nvct.path:", "nvidia-ctk.path:")) else "nvct.path"
            yield fail("config.hook", str(e), ctx.set_command(key, "/usr/bin/nvct"))
            return
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        if ctx.config.mode == "legacy":
            broken = "GPU containers fail to start at their prestart hook"
        else:  # the shim leaves it the params mask at least (nvct.modifier.prepare, docs/security.md)
            broken = ("GPU containers fail to start at their createContainer hook (it masks the driver params on "
                      "every start, and does the links and ld cache the shim cannot write itself)")
        yield fail("config.hook", f"{path} ({key}, run by containers' hooks in {ctx.config.mode} mode) "
                   f"is not an executable file: {broken}", ctx.set_command(key, "<absolute path of it>"))
        return
    if key == "nvidia-ctk.path" and _compiled(path):
        yield fail("config.hook", f"{path} (nvidia-ctk.path) is a compiled program, not nvct's nvidia-ctk: "
                   "NVIDIA's own cannot run nvct's hook chain, so GPU containers would not start",
                   ctx.set_command("nvct.path", "/usr/bin/nvct"))
        return
    yield ok("config.hook", f"{ctx.config.mode} mode: containers' hooks run {path}")


def _compiled(path: str) -> bool:
    """An ELF file: nvct's programs are scripts (the package's and the toolkit's wrappers)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def check_ldconfig(ctx: Context):
    """The host ldconfig that builds containers' ld caches: a static executable, or every GPU start fails."""
    if ctx.config is None:
        yield ctx.skipped("config.ldconfig", "nvct's config does not load (see config.file)")
        return
    value = ctx.config.cli_ldconfig
    try:
        path = ldconfig.host_ldconfig_path(value)
        os.close(ldconfig.open_static_executable(path))
    except NvctError as e:
        yield fail("config.ldconfig", f"{e} (nvidia-container-cli.ldconfig is {value!r}): GPU containers fail to "
                   "start", ctx.set_command("nvidia-container-cli.ldconfig", ldconfig.DEFAULT))
        return
    yield ok("config.ldconfig", f"containers' ld caches are built with {path}, a static executable")


def check_log(ctx: Context):
    if ctx.config is None:
        yield ctx.skipped("config.log", "nvct's config does not load (see config.file)")
        return
    path = ctx.config.runtime_debug or ""
    level = ctx.config.runtime_log_level or "info"
    if path in ("", "/dev/null"):
        yield info("config.log", "container starts are not logged (nvidia-container-runtime.debug is /dev/null)",
                   "to log them: " + ctx.set_command("nvidia-container-runtime.debug",
                                                     "/var/log/nvidia-container-runtime.log"))
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        yield warn("config.log", f"log file {path}: directory {directory} does not exist (nothing is logged)",
                   f"mkdir -p {directory}")
        return
    yield ok("config.log", f"container starts are logged to {path} (log-level {level})")


CHECKS = (check_file, check_roots, check_runtimes, check_hook, check_ldconfig, check_log)
