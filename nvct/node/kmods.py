"""``load-kmods``: load the NVIDIA kernel modules and create their control nodes.

What libnvidia-container documents for ``--load-kmods`` (and the config's
``nvidia-container-cli.load-kmods``, which the legacy hook honours): before
looking at the driver, load ``nvidia``, ``nvidia_uvm`` and ``nvidia_modeset``
with the kernel's modprobe (``/proc/sys/kernel/modprobe``) when they are not
loaded yet, then create ``/dev/nvidiactl``, ``/dev/nvidia-modeset`` and
``/dev/nvidia-uvm(-tools)``. A failure is logged, never fatal: the driver
checks that follow say what is really missing.

Modules can only be loaded into the running kernel, so a proc root other
than ``/proc`` (a driver container's view, a simulated node) loads nothing.
"""

from __future__ import annotations

import os

MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")
_MODPROBE_SYSCTL = "/proc/sys/kernel/modprobe"
_DEFAULT_MODPROBE = "/sbin/modprobe"
#: modprobe gets this environment, never the caller's (a hook's may come from anywhere).
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def loaded_modules(proc_root: str = "/proc") -> set[str] | None:
    """Names in ``/proc/modules``; None without it (a kernel without modules: all is built in)."""
    try:
        with open(os.path.join(proc_root, "modules"), encoding="ascii", errors="replace") as f:
            return {line.split(" ", 1)[0] for line in f if line.strip()}
    except OSError:
        return None


def modprobe_path() -> str:
    try:
        with open(_MODPROBE_SYSCTL, encoding="ascii", errors="replace") as f:
            path = f.read().strip()
    except OSError:
        path = ""
    return path if path.startswith("/") else _DEFAULT_MODPROBE


def load(proc_root: str = "/proc", dev_root: str = "/", *, modprobe: str | None = None) -> list[str]:
    """Load what is missing and create the control nodes; returns the problems (already logged)."""
    from nvct.base.log import logger

    if os.path.normpath(proc_root) != "/proc":
        return []
    problems = []
    loaded = loaded_modules(proc_root)
    if loaded is not None:
        program = modprobe or modprobe_path()
        for module in MODULES:
            if module in loaded:
                continue
            if module != "nvidia" and "nvidia" not in loaded:
                problems.append(f"could not load kernel module {module}: nvidia is not loaded")
                continue
            logger.info("loading kernel module %s", module)
            reason = _modprobe(program, module)
            if reason is None:
                loaded.add(module)
            else:
                problems.append(f"could not load kernel module {module} ({program}: {reason})")
    problems += _create_nodes(proc_root, dev_root)
    for problem in problems:
        logger.warning("%s", problem)
    return problems


def _modprobe(program: str, module: str) -> str | None:
    """None when loaded, else why not."""
    import subprocess  # only when a module is missing: ~3 ms off every hook start

    try:
        proc = subprocess.run([program, module], stdin=subprocess.DEVNULL, capture_output=True,
                              env=_ENV, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(getattr(e, "strerror", None) or e)
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or b"").decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _create_nodes(proc_root: str, dev_root: str) -> list[str]:
    from nvct.base.errors import NvctError
    from nvct.node import devices as system

    try:
        system.create_device_nodes(system.control_nodes(proc_root), dev_root)
    except NvctError as e:
        return [f"could not create the kernel module device nodes: {e}"]
    except OSError as e:
        return [f"could not create the kernel module device nodes: {e.filename}: {e.strerror}"]
    return []
