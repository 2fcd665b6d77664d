"""What every check shares: the finding it returns, the options, and the node's facts.

A check is a function ``check(ctx) -> Iterable[Finding]``. It only reads:
the doctor changes nothing, so a fix is always text for the operator to run.
Facts several checks need (the config, the driver, the ld cache) are read
once, here, and a fact that cannot be read is remembered as its error so
each check can say it was skipped and why.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from nvct.base.errors import NvctError
from nvct.config import file as config
from nvct.discover.driver import Driver
from nvct.toolkit.layout import SUBDIR
from nvct.toolkit.options import DEFAULT_INSTALL_DIR

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
STATUSES = (OK, INFO, WARN, FAIL)

#: Where a driver install puts its libraries (64-bit first), relative to its root.
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu",
            "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib", "/usr/lib/i386-linux-gnu", "/usr/lib32",
            "/lib/i386-linux-gnu")

#: Where else a node's driver may be installed: a driver container's root (GPU Operator), the host's.
OTHER_DRIVER_ROOTS = ("/run/nvidia/driver", "/")

#: The PATH systemd gives services: dockerd's, when no dockerd runs to ask.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

@dataclass(frozen=True)
class Finding:
    """One line of the report: ``seen`` is what was found, ``fix`` what to run or change."""

    id: str
    status: str
    seen: str
    fix: str = ""

    def to_json(self) -> dict:
        out = {"id": self.id, "status": self.status, "seen": self.seen}
        if self.fix:
            out["fix"] = self.fix
        return out


def ok(id: str, seen: str) -> Finding:
    return Finding(id, OK, seen)


def info(id: str, seen: str, fix: str = "") -> Finding:
    return Finding(id, INFO, seen, fix)


def warn(id: str, seen: str, fix: str) -> Finding:
    return Finding(id, WARN, seen, fix)


def fail(id: str, seen: str, fix: str) -> Finding:
    return Finding(id, FAIL, seen, fix)


@dataclass
class Options:
    """What to look at; the defaults are where a stock node keeps each file."""

    config_path: str | None = None
    deep: bool = False
    docker_config: str = "/etc/docker/daemon.json"
    docker_socket: str = "/var/run/docker.sock"
    docker_pidfile: str = "/var/run/docker.pid"
    containerd_config: str = "/etc/containerd/config.toml"
    crio_dir: str = "/etc/crio/crio.conf.d"
    #: CDI spec directories; empty: the config's ``spec-dirs``.
    cdi_dirs: tuple[str, ...] = ()
    #: dockerd's PATH when no running dockerd can be asked.
    default_path: str = DEFAULT_PATH
    #: where ``nvct toolkit install`` puts the toolkit (stand-ins of a removed one stay there)
    toolkit_dirs: tuple[str, ...] = field(default_factory=lambda: (default_toolkit_dir(),))
    env: dict = field(default_factory=lambda: dict(os.environ))


def default_toolkit_dir() -> str:
    """``nvct toolkit install``'s toolkit directory by default (``--toolkit-install-dir``/toolkit)."""
    return os.path.join(DEFAULT_INSTALL_DIR, SUBDIR)


class Context:
    """The node as the checks see it; each fact is read on first use."""

    def __init__(self, options: Options):
        self.options = options
        self._memo: dict = {}

    def memo(self, key: str, compute):
        """``compute()`` once per run: for facts the checks of one group share."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # --- nvct's config ---
    @functools.cached_property
    def _config(self):
        try:
            return config.load(self.options.config_path, env=self.options.env), None
        except NvctError as e:
            return None, str(e)

    @property
    def config(self):
        """The loaded config, or None when it does not load (see ``config_error``)."""
        return self._config[0]

    @property
    def config_error(self) -> str | None:
        return self._config[1]

    @property
    def config_file(self) -> str:
        """The file nvct reads (which may not exist)."""
        return self.options.config_path or config.default_path(self.options.env)

    def set_command(self, key: str, value: str) -> str:
        """The ``nvct config`` command that sets ``key`` in the file nvct reads."""
        return f"nvct config -c {self.config_file} --set {key}={value} -i"

    # --- the driver ---
    @functools.cached_property
    def driver(self):
        return Driver.from_config(self.config) if self.config is not None else None

    @functools.cached_property
    def _version(self):
        if self.driver is None:
            return None, "nvct's config does not load"
        try:
            return self.driver.version, None
        except NvctError as e:
            return None, str(e)

    @property
    def version(self) -> str | None:
        """The kernel module's version, or None (``version_error`` says why)."""
        return self._version[0]

    @property
    def version_error(self) -> str | None:
        return self._version[1]

    @functools.cached_property
    def _gpus(self):
        if self.version is None:
            return None, self.version_error
        try:
            return self.driver.gpus, None
        except NvctError as e:
            return None, str(e)

    @property
    def gpus(self):
        """GPUs from procfs, or None when they cannot be read (``gpus_error``)."""
        return self._gpus[0]

    @property
    def gpus_error(self) -> str | None:
        return self._gpus[1]

    @functools.cached_property
    def _ldcache(self):
        if self.driver is None:
            return None, "nvct's config does not load"
        try:
            return self.driver.cache_entries(), None
        except (NvctError, OSError) as e:
            return None, str(e)

    @property
    def ldcache(self):
        """The driver root's ld.so.cache entries, or None (``ldcache_error``)."""
        return self._ldcache[0]

    @property
    def ldcache_error(self) -> str | None:
        return self._ldcache[1]

    @functools.cached_property
    def empty_driver_root(self) -> str | None:
        """Why the driver root holds nothing of the loaded driver, or None.

        Then the shim gives containers device nodes and no libraries (they
        start, without nvidia-smi): the root setting is at fault, which
        ``config.roots`` names, not the libraries, whose checks then skip.
        """
        if self.version is None or self.missing_root("driver"):
            return None
        root = self.driver.driver_root
        if holds_driver(root, self.version) or self._cache_names_driver():
            return None
        return f"the driver root {root} (nvidia-container-cli.root) holds no driver {self.version} libraries"

    def _cache_names_driver(self) -> bool:
        return any(e.key.startswith(("libnvidia-ml.so", "libcuda.so")) for e in self.ldcache or ())

    def driver_root_elsewhere(self) -> str | None:
        """Another directory that holds the loaded driver's libraries: the dev root, the proc root's
        parent (a simulated node), a driver container's root, the host's."""
        driver = self.driver
        candidates = [driver.dev_root]
        if os.path.basename(os.path.normpath(driver.proc_root)) == "proc":
            candidates.append(os.path.dirname(os.path.normpath(driver.proc_root)))
        candidates += OTHER_DRIVER_ROOTS
        here, version = os.path.normpath(driver.driver_root), self.version
        if version is None:
            return None
        for root in candidates:
            if os.path.normpath(root) != here and holds_driver(root, version):
                return os.path.normpath(root)
        return None

    def skipped(self, id: str, why: str) -> Finding:
        return info(id, f"not checked: {why}")

    def missing_root(self, which: str) -> str | None:
        """Why checks that look under the ``driver`` or ``dev`` root cannot run, or None.

        A root that does not exist is one fault (``config.roots`` fails with the
        fix); the checks that depend on it report ``info`` instead of failing
        again with fixes aimed at the wrong directory.
        """
        if self.driver is None:
            return None
        key = {"driver": "nvidia-container-cli.root", "dev": "nvct.dev-root"}[which]
        root = self.driver.driver_root if which == "driver" else self.driver.dev_root
        if os.path.isdir(root):
            return None
        return f"the {which} root {root} ({key}) does not exist (see config.roots)"


def holds_driver(root: str, version: str) -> bool:
    """Whether ``root`` has driver ``version``'s NVML or CUDA library in a library directory."""
    for directory in LIB_DIRS[:5]:
        for base in ("libnvidia-ml.so.", "libcuda.so."):
            if os.path.isfile(os.path.join(root, directory.lstrip("/"), base + version)):
                return True
    return False
