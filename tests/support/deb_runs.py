"""GPU containers through nvct installed from the project's .deb, as a node has it.

The .deb (built once per session: :func:`tests.packaging.pkgtest.built_deb`,
or ``NVCT_TEST_DEB``, another build's, to see a test fail) is installed with
``dpkg -i`` into a private mount namespace: this machine's /usr, /etc and /var
under overlays whose writes land in a tmpfs, its own /run (so /run/nvct,
/var/run/cdi and systemd's sockets are its own) and an empty /etc/cdi. There
the package's own programs run: ``/usr/bin/nvidia-container-runtime`` (and
its ``.cdi`` link for cdi mode), the hooks, ``nvidia-ctk``, Debian's python3
and the package's modules, with the package's config.toml edited by
``nvidia-ctk config -i --set`` to the simulated node's roots and jit-cdi mode,
and the CDI spec ``nvidia-ctk cdi generate`` writes where nvidia-cdi-refresh
would (/var/run/cdi/nvidia.yaml). Nothing of it is seen outside.

A process holds that namespace for the session; per low-level runtime a
namespace inside it holds the config naming that runtime (bound over the
package's) and a debug log, moved to ``tmp_path/nvct.log`` after each start
as for a toolkit (:func:`tests.support.toolkit_runs.run_toolkit_gpu`). Each
start enters its runtime's namespace with ``nsenter``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from .runtimes import RUNTIMES

#: The modes of a deb install: the config's (set to jit-cdi) and the ``.cdi`` link's.
DEB_MODES = ("jit-cdi", "cdi")
#: What a node has instead of the package (it conflicts with them), and the package.
_PACKAGES = ("nvct", "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools")
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}

#: Run as ``unshare -m --propagation private bash -c``, in $W: the node's root, then the package.
#: The package's own directories ($OWN) are opaque in the overlays: a change of this machine's
#: (another test's apt install of nvct) cannot show through them.
_INSTALL = r"""
set -eu
mount -t tmpfs nvct-deb-layers "$W/layers"
for d in $OWN; do mkdir -p "$W/layers/up/$d"; done
cd "$W/layers/up"
python3 -c 'import os, sys; [os.setxattr(d, "trusted.overlay.opaque", b"y") for d in sys.argv[1:]]' $OWN
cd /
for d in usr etc var; do
    mkdir -p "$W/layers/up/$d" "$W/layers/work/$d"
    mount -t overlay nvct-deb -o "lowerdir=/$d,upperdir=$W/layers/up/$d,workdir=$W/layers/work/$d" "/$d"
done
mount -t tmpfs nvct-deb-run /run
mkdir -p /run/lock /etc/cdi
mount -t tmpfs nvct-deb-cdi /etc/cdi
dpkg -i "$DEB" > "$W/dpkg.log" 2>&1 || { cat "$W/dpkg.log" >&2; exit 1; }
nvidia-ctk config -i --set "nvidia-container-cli.root=$DRIVER_ROOT" --set "nvct.dev-root=$DEV_ROOT" \
    --set "nvct.proc-root=$PROC_ROOT" --set nvidia-container-runtime.mode=jit-cdi
NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml nvidia-ctk cdi generate
echo ready
exec cat
"""

#: Run inside the install's namespace, in $W: the config naming one runtime and a debug log.
_RUNTIME = r"""
set -eu
cp /etc/nvidia-container-runtime/config.toml "$W/config.toml"
nvidia-ctk config -c "$W/config.toml" -i --set "nvidia-container-runtime.runtimes=$RUNTIME" \
    --set "nvidia-container-runtime.debug=$W/nvct.log"
mount --bind "$W/config.toml" /etc/nvidia-container-runtime/config.toml
echo ready
exec cat
"""


@dataclass
class DebNode:
    """nvct from the .deb, installed in a private root, its config naming one runtime.

    Quacks like :class:`tests.support.toolkit_runs.Toolkit`: ``runtime``, ``tool``, ``log``, ``enter``.
    """

    holder: subprocess.Popen
    log: str

    def runtime(self, mode: str) -> str:
        """The runtime program an engine is given for ``mode``."""
        if mode not in DEB_MODES:
            raise AssertionError(f"deb runs cover {DEB_MODES}, not {mode!r}")
        return "/usr/bin/nvidia-container-runtime" + (".cdi" if mode == "cdi" else "")

    def tool(self, name: str) -> str:
        return os.path.join("/usr/bin", name)

    def enter(self, cwd: str = "/") -> list[str]:
        """The argv prefix that runs a program in this install's private root, in ``cwd``."""
        if self.holder.poll() is not None:  # else every start would fail in nsenter, not in nvct
            raise AssertionError(f"the deb's private root is gone: its holder exited ({self.holder.returncode})")
        return ["/usr/bin/nsenter", "-t", str(self.holder.pid), "-m", f"--wd={cwd}", "--"]

    def mounts_under(self, path: str) -> list[str]:
        """Mount points at or below ``path`` in the private root (none may be left after a run)."""
        from nvct.linux.namespaces import mounts

        prefix = os.path.realpath(path).rstrip("/") + "/"
        return [m.mount_point for m in mounts(self.holder.pid) if (m.mount_point + "/").startswith(prefix)]


def _own_directories(deb: str | os.PathLike) -> list[str]:
    """The directories only the package has (its name in theirs), topmost first: ``usr/libexec/nvct``, ..."""
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, env=_ENV, check=True)
    own: list[str] = []
    for line in listing.stdout.splitlines():
        path = line.split(None, 5)[5].removeprefix("./").rstrip("/")
        if (line.startswith("d") and not any(path.startswith(d + "/") for d in own)
                and path.startswith(("usr/", "etc/")) and ("nvct" in path.rsplit("/", 1)[-1]
                                                          or path == "etc/nvidia-container-runtime")):
            own.append(path)
    return own


def _hold(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start a namespace's holder; return once it is ready (it prints ``ready``, then waits on stdin)."""
    holder = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**_ENV, **env}, text=True)
    said = ""
    for line in holder.stdout:  # what the set-up's programs print, then "ready"
        if line == "ready\n":
            return holder
        said += line
    said += holder.stderr.read()
    _release(holder)
    raise AssertionError(f"the deb's private root could not be set up: {said}")


def _release(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    try:
        holder.wait(timeout=30)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    holder.stdout.close()
    holder.stderr.close()


class DebInstall:
    """The .deb installed once in a private root for ``node``; :meth:`node` per runtime."""

    def __init__(self, directory: str, deb: str | os.PathLike, node: Mapping):
        self._directory = directory
        roots = node["roots"]
        layers = os.path.join(directory, "layers")
        os.makedirs(layers)
        self._holder = _hold(["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/bash", "-c", _INSTALL],
                             {"W": directory, "DEB": str(deb), "OWN": " ".join(_own_directories(deb)),
                              "DRIVER_ROOT": roots["driver_root"], "DEV_ROOT": roots["dev_root"],
                              "PROC_ROOT": roots["proc_root"]})
        self._nodes: dict[str, DebNode] = {}

    def node(self, runtime: str) -> DebNode:
        """The install with its config naming ``runtime`` (once per runtime)."""
        if runtime not in self._nodes:
            directory = os.path.join(self._directory, runtime)
            os.makedirs(directory)
            holder = _hold(["/usr/bin/nsenter", "-t", str(self._holder.pid), "-m", "--", "/usr/bin/unshare", "-m",
                            "--propagation", "private", "/bin/bash", "-c", _RUNTIME],
                           {"W": directory, "RUNTIME": RUNTIMES[runtime][0]})
            self._nodes[runtime] = DebNode(holder, os.path.join(directory, "nvct.log"))
        return self._nodes[runtime]

    def close(self) -> None:
        for node in self._nodes.values():
            _release(node.holder)
        _release(self._holder)


@contextlib.contextmanager
def install_deb(tmp_path_factory, node: Mapping) -> Iterator[Callable[[str], DebNode]]:
    """runtime -> :class:`DebNode`: the .deb under test installed once for ``node``; all gone on exit."""
    from . import cgroupfix
    from .fixtures import need_binaries, need_root, skip

    need_root("installs the .deb in a private root")
    need_binaries("/usr/bin/unshare", "/usr/bin/nsenter", "/usr/bin/dpkg")
    for package in _PACKAGES:  # the private root starts from this machine's /usr, /etc and /var
        state = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Status}", package], capture_output=True,
                               text=True, env=_ENV).stdout.strip()
        if state not in ("", "not-installed"):
            skip(f"{package} is on this machine ({state}): the private root would start with it")
    deb = deb_under_test(tmp_path_factory)
    if os.path.exists(RUNTIMES["crun"][0]):  # before the namespace is made: it sees only the mounts there now
        cgroupfix.ensure_crun_works()
    installed = DebInstall(str(tmp_path_factory.mktemp("deb-node")), deb, node)
    try:
        yield installed.node
    finally:
        installed.close()


def deb_under_test(tmp_path_factory) -> Path:
    """``NVCT_TEST_DEB`` (another build's .deb), else this tree's, built once per session."""
    if os.environ.get("NVCT_TEST_DEB"):
        other = Path(os.environ["NVCT_TEST_DEB"])
        assert other.is_file(), f"NVCT_TEST_DEB={other}: no such file"
        return other
    from tests.packaging.pkgtest import built_deb

    return built_deb(tmp_path_factory)
