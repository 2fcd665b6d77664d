"""A node root with today's engines (containerd 2.x, runc 1.3, crun, docker 28, podman 5), and a way in.

The host is Debian 12 (containerd 1.6, docker 20.10); the engines operators
run today come from Debian's newer suites. ``mmdebstrap`` builds a root from
such a suite, once per cache directory (``build/noderoot`` in the checkout,
which git ignores; ``NVCT_NODEROOT_CACHE`` overrides). Nothing is installed
on the host.

:class:`NodeRoot` runs commands in that root: a holder process keeps one
private mount namespace with fresh ``/proc``, the host's ``/sys``, ``/dev``
and ``/tmp`` (so test directories and the simulated node keep their paths),
a private ``/run`` (CDI specs in ``/var/run/cdi`` stay inside), and the
checkout, read-only, at its own path; the root is that namespace's own ``/``
(pivot_root), so a hook that enters a container's mount namespace resolves
paths there as the engine did. Each command enters it with ``nsenter -m``.
A session holds the root's lock shared: a rebuild waits. nvct runs there from the checkout, under the
root's own python3: a ``.pth`` file in the root's dist-packages names the
checkout, and its programs are ``nvct/scripts/*`` of the checkout.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import time
from typing import Iterator, Mapping, Sequence

from .containerd import Containerd
from .proc import Result, run, stop_pid

_CRI_V2 = "io.containerd.grpc.v1.cri"
#: containerd 2.x's CRI plugins (config version 3): runtimes and images split.
CRI_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_IMAGES = "io.containerd.cri.v1.images"

#: The suite with containerd 2.1, runc 1.3, crun 1.2x, docker.io 28, podman 5.8 (trixie has containerd 1.7).
SUITE = os.environ.get("NVCT_NODEROOT_SUITE", "forky")
PACKAGES = (
    "containerd", "runc", "crun", "docker.io", "podman",
    # nvct itself, under the root's python3
    "python3", "python3-click", "python3-tomlkit", "python3-yaml", "python3-pyelftools", "python3-prctl",
)
#: The checkout (the directory holding the nvct package).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(CHECKOUT, "nvct", "scripts")
#: A built root is reused for this long; the suite moves on.
MAX_AGE_S = 7 * 24 * 3600
_PTH = "usr/lib/python3/dist-packages/nvct-checkout.pth"
_DONE = ".nvct-noderoot"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NodeRootError(RuntimeError):
    """The node root could not be built or entered (the message says why)."""


def apt_mirror(sources: Sequence[str] = ("/etc/apt/sources.list", "/etc/apt/sources.list.d")) -> str:
    """The Debian mirror this machine's apt uses for its own release (not -security/-updates)."""
    codename = _os_release().get("VERSION_CODENAME", "")
    files = []
    for path in sources:
        files += sorted(glob.glob(os.path.join(path, "*"))) if os.path.isdir(path) else [path]
    for path in files:
        if not path.endswith((".list", ".sources")) or not os.path.isfile(path):
            continue
        with open(path) as f:
            text = f.read()
        for uris, suites in (_deb822(text) if path.endswith(".sources") else _one_line(text)):
            if codename in suites:
                return uris[0]
    raise NodeRootError(f"no apt source for {codename or 'this release'} in {', '.join(sources)}: "
                        f"set NVCT_NODEROOT_MIRROR")


def _os_release() -> dict:
    try:
        with open("/etc/os-release") as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return {}


def _deb822(text: str):
    for stanza in text.split("\n\n"):
        fields: dict = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.split()
        if "deb" in fields.get("types", []) and fields.get("uris") and fields.get("enabled", ["yes"]) != ["no"]:
            yield fields["uris"], fields.get("suites", [])


def _one_line(text: str):
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()  # options: [arch=... signed-by=...]
        if len(words) >= 3 and words[0] == "deb":
            yield [words[1]], [words[2]]


def cache_dir() -> str:
    return os.environ.get("NVCT_NODEROOT_CACHE") or os.path.join(CHECKOUT, "build", "noderoot")


def cached_node_root(suite: str = SUITE, packages: Sequence[str] = PACKAGES) -> str:
    """The built root for ``suite`` with ``packages``: from the cache, else built now (minutes)."""
    key = hashlib.sha256(repr((suite, sorted(packages))).encode()).hexdigest()[:12]
    base = cache_dir()
    os.makedirs(base, exist_ok=True)
    root = os.path.join(base, f"{suite}-{key}")
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if _fresh(root):
            return root
        if os.path.exists(os.path.join(root, _DONE)):  # old: rebuilt unless a session uses it
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return root
        else:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait and reuse
        if _fresh(root):
            return root
        _remove_root(root)
        mirror = os.environ.get("NVCT_NODEROOT_MIRROR") or apt_mirror()
        building = root + ".building"
        _remove_root(building)
        build_node_root(building, suite=suite, packages=packages, mirror=mirror)
        with open(os.path.join(building, _DONE), "w") as f:
            f.write(f"{suite} {' '.join(sorted(packages))} {mirror}\n")
        os.rename(building, root)
    return root


def _remove_root(root: str) -> None:
    """rmtree, refused while anything is mounted under ``root`` here (it could be the host's /tmp)."""
    from nvct.linux.namespaces import mounts

    prefix = os.path.realpath(root) + "/"
    inside = [m.mount_point for m in mounts() if (m.mount_point + "/").startswith(prefix)]
    if inside:
        raise NodeRootError(f"{root}: not removed, {inside[0]} is mounted under it")
    shutil.rmtree(root, ignore_errors=True)


def _fresh(root: str) -> bool:
    done = os.path.join(root, _DONE)
    return os.path.exists(done) and time.time() - os.stat(done).st_mtime < MAX_AGE_S


def build_node_root(dest: str, *, suite: str, packages: Sequence[str], mirror: str) -> None:
    """``mmdebstrap`` ``suite`` with ``packages`` into the directory ``dest`` (no daemon started)."""
    if shutil.which("mmdebstrap") is None:
        raise NodeRootError("mmdebstrap is not installed (scripts/setup.sh installs it)")
    argv = ["mmdebstrap", "--variant=apt", "--mode=root", "--include=" + ",".join(packages),
            "--aptopt=Acquire::Check-Valid-Until \"false\"",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            # No packaged config: `containerd config dump` without --config shows containerd's defaults.
            "--customize-hook=rm -f \"$1/etc/containerd/config.toml\"",
            suite, dest, mirror]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        _remove_root(dest)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise NodeRootError(f"mmdebstrap {suite} from {mirror} failed ({proc.returncode}):\n{tail}")


def package_versions(root: str, packages: Sequence[str]) -> dict[str, str]:
    """``dpkg-query`` of the root's packages: name -> version."""
    out = subprocess.run(["dpkg-query", "--admindir", os.path.join(root, "var/lib/dpkg"), "-W", *packages],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


@contextlib.contextmanager
def entered_node_root() -> Iterator["NodeRoot"]:
    """The cached root (containerd 2.x), entered: what every node test module's ``node`` fixture holds.

    Skips, as the fixtures do, when not root or a build tool is missing.
    """
    from . import cgroupfix
    from .fixtures import need_binaries, need_root

    need_root("builds and enters a node root")
    need_binaries("/usr/bin/mmdebstrap", "/usr/bin/nsenter", "/usr/bin/unshare")
    cgroupfix.ensure_crun_works()  # before the root's namespace copies the host's /sys
    root = cached_node_root()
    versions = package_versions(root, PACKAGES)
    print(f"\nnode root: {versions}")
    assert versions["containerd"].startswith("2."), versions  # the suite moved on, or the mirror is old
    with NodeRoot(root) as n:
        yield n


class NodeRoot:
    """``with NodeRoot(root) as node: node.run(["containerd", "--version"])``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.pid: int | None = None
        self._holder: subprocess.Popen | None = None
        self._lock = None

    @property
    def prefix(self) -> list[str]:
        """argv that runs the rest in the root's namespace (where the root is ``/``)."""
        if self.pid is None:
            raise NodeRootError("the node root is not entered (use it as a context manager)")
        return ["nsenter", f"--target={self.pid}", "--mount", "--"]

    @property
    def nvct_bin(self) -> str:
        """Where nvct's programs are inside the root (the checkout's, run by the root's python3)."""
        return SCRIPTS

    def start(self) -> "NodeRoot":
        self._lock = open(self.root + ".lock", "w")
        fcntl.flock(self._lock, fcntl.LOCK_SH)  # no rebuild while the root is in use
        for d in ("proc", "sys", "dev", "tmp", "run", ".oldroot", CHECKOUT.lstrip("/")):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)
        pth = os.path.join(self.root, _PTH)
        with open(f"{pth}.{os.getpid()}", "w") as f:
            f.write(CHECKOUT + "\n")
        os.replace(f"{pth}.{os.getpid()}", pth)
        r = self.root
        script = "\n".join([
            "set -e",
            f"mount --bind '{r}' '{r}'",
            f"mount -t proc proc '{r}/proc'",
            f"mount --rbind /sys '{r}/sys'",
            f"mount --rbind /dev '{r}/dev'",
            f"mount --rbind /tmp '{r}/tmp'",
            f"mount -t tmpfs -o mode=755 tmpfs '{r}/run'",
            f"mount --bind '{CHECKOUT}' '{r}{CHECKOUT}'",
            f"mount -o remount,bind,ro '{r}{CHECKOUT}'",
            f"mkdir -p '{r}/.oldroot'",
            # The root becomes the namespace's own root: nsenter, and hooks entering a
            # container's namespace (setns), then resolve paths in it, not in the host's.
            f"cd '{r}' && pivot_root . .oldroot && cd /",
            "/.oldroot/usr/bin/umount -l /.oldroot",
            "echo ready",
            "exec sleep infinity",
        ])
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=_die_with_parent)
        line = self._holder.stdout.readline()
        if line.strip() != b"ready":
            self._holder.wait(10)
            err = self._holder.stderr.read().decode(errors="replace")
            self.stop()
            raise NodeRootError(f"could not set up the node root's namespace: {err.strip()}")
        self.pid = self._holder.pid
        return self

    def stop(self) -> None:
        if self._holder is not None:
            stop_pid(self._holder.pid, timeout=5)
            self._holder.wait()
            self._holder.stdout.close()
            self._holder.stderr.close()
            self._holder = None
        self.pid = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "NodeRoot":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {"PATH": _PATH, "HOME": "/root", "LANG": "C.UTF-8", **(extra or {})}

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120,
            input: str | None = None) -> Result:
        """``argv`` inside the root (PATH the root's own)."""
        return run([*self.prefix, *argv], env=self.env(env), timeout=timeout, input=input)

    def nvct(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> Result:
        """``nvct ARGS`` inside the root, from the checkout, under the root's python3."""
        return self.run([os.path.join(SCRIPTS, "nvct"), *args], env=env, timeout=timeout)


def _die_with_parent() -> None:
    """A killed test run leaves no holder (and namespace) behind."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class NodeContainerd(Containerd):
    """The root's containerd, in its namespace, with a config of ``config_version`` 2 or 3.

    Paths (socket, state, data) are the host's ``/tmp`` ones, which the root
    shares; the CRI client and ``ctr`` work as with :class:`Containerd`.
    """

    def __init__(self, node: NodeRoot, *, config_version: int = 3, nri: bool = False, **kwargs) -> None:
        kwargs.setdefault("runtimes", {})
        super().__init__(wrapper=node.prefix, **kwargs)
        self.node = node
        self.config_version = config_version
        #: With ``nri``: NRI enabled, its socket here (no plugins launched from the node's /opt/nri).
        self.nri_socket = os.path.join(self.state_dir, "nri.sock") if nri else None

    def config(self) -> dict:
        config = super().config()
        if self.nri_socket:
            config["plugins"]["io.containerd.nri.v1.nri"] = {
                "disable": False, "socket_path": self.nri_socket,
                "plugin_path": os.path.join(self.state_dir, "nri-plugins"),
                "plugin_config_path": os.path.join(self.state_dir, "nri-conf.d")}
        if self.config_version == 2:
            return config
        cri = config["plugins"].pop(_CRI_V2)
        config["version"] = 3
        config["plugins"][CRI_IMAGES] = {"pinned_images": {"sandbox": cri.pop("sandbox_image")}}
        config["plugins"][CRI_RUNTIME] = cri
        return config
