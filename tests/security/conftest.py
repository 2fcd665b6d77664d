"""Hostile-image test kit: a host tree to protect, a container root to attack it from.

Every test ends by checking that the host tree is exactly as it was (types,
modes, owners, sizes, mtimes, ctimes, link targets, contents) and that no mount
appeared outside the container root: neither in this session's namespace nor
in the private namespace where the operations ran.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from nvct.base.errors import ContainerError
from nvct.linux import fs
from nvct.linux.namespaces import in_private_mount_namespace, mounts
from nvct.linux.privileges import drop_capabilities
from nvct.rootfs.root import Rootfs
from tests.support.fixtures import skip


def snapshot(top: Path) -> dict[str, tuple]:
    """Everything observable about the tree at ``top`` (symlinks not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in ["", *dirnames, *filenames]:
            path = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            else:
                content = st.st_rdev
            out[os.path.relpath(path, top)] = (
                stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,
                st.st_size, st.st_mtime_ns, st.st_ctime_ns, content)
    return out


@dataclass
class Scene:
    """A protected host tree, trusted driver files, and a container root."""

    host: Path  # what the image wants to reach: must never change
    driver: Path  # trusted host sources for bind mounts
    root: Path  # the container root filesystem (all three share a parent)

    def freeze(self) -> None:
        self._before = (snapshot(self.host), snapshot(self.driver), self._session_mounts())

    def _session_mounts(self) -> list:
        # Only ours: other software on the machine mounts things concurrently.
        top = str(self.root.parent)
        return sorted(m for m in mounts() if m.mount_point == top
                      or m.mount_point.startswith(top + "/"))

    def assert_host_untouched(self) -> None:
        after = (snapshot(self.host), snapshot(self.driver), self._session_mounts())
        assert after[0] == self._before[0], "host tree changed"
        assert after[1] == self._before[1], "driver files changed"
        assert after[2] == self._before[2], "a mount leaked into the session's namespace"

    def link(self, at: str, kind: str, target: str, pid: int | None = None) -> str:
        """Plant a symlink at container path ``at`` that escapes to host ``target``.

        kind: 'absolute' (host path as link text), 'relative' (enough '..' to
        climb out of the root when resolved naively), or 'magic' (through
        /proc/<pid>/root, with procfs mounted at the root's /proc).
        Returns the in-root path the link means to a resolver that stays in.
        """
        path = self.root / at.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        host_abs = str(target)
        if kind == "absolute":
            text = host_abs
            inside = host_abs
        elif kind == "relative":
            text = os.path.relpath(host_abs, path.parent)
            inside = "/" + os.path.relpath(host_abs, self.root.parent)
        elif kind == "magic":
            text = f"/proc/{pid or os.getpid()}/root{host_abs}"
            inside = None
        else:
            raise AssertionError(kind)
        path.symlink_to(text)
        if kind != "magic":
            # the naive reading really is the host: the attack is real
            assert os.path.realpath(path) == os.path.realpath(host_abs)
        return inside

    def attempt(self, ops: list[Callable[[Rootfs], object]], *, proc: bool = False,
                resolver: str = "openat2", contained: bool = True
                ) -> tuple[list[str | None], list]:
        """Run each ``op(Rootfs(root))`` in one private mount namespace.

        Returns (per op: its ContainerError message or None, the mounts that
        appeared). With ``proc``, procfs is first mounted at the root's /proc,
        as runc does before hooks run. Every new mount must be inside the root
        (``contained=False`` only for demonstrations of naive code).
        """
        root = str(self.root)

        def work():
            if resolver == "walk":
                fs._have_openat2 = False
            if proc:
                (self.root / "proc").mkdir(exist_ok=True)
                fs.mount("proc", f"{root}/proc", "proc", fs.MS_NOSUID)
            before = set(mounts())
            errors: list[str | None] = []
            with Rootfs(root) as r:
                for op in ops:
                    try:
                        op(r)
                        errors.append(None)
                    except ContainerError as e:
                        errors.append(str(e))
            new = [m for m in mounts() if m not in before]
            return errors, new

        errors, new = in_private_mount_namespace(work)
        for m in new if contained else ():
            assert m.mount_point.startswith(root + "/"), f"mount outside the root: {m}"
        return errors, new


@pytest.fixture(params=["openat2", "walk"])
def resolver(request):
    """Each hostile test runs against openat2(2) and against the fallback walk."""
    if request.param == "openat2" and not fs.openat2_available():
        skip("kernel has no openat2(2); the walk variant covers this test")
    return request.param


@pytest.fixture
def scene(tmp_path):
    host = tmp_path / "host"
    for sub in ("lib", "firmware", "etc/ld.so.conf.d", "dev"):
        (host / sub).mkdir(parents=True)
    (host / "lib/libhost.so.1.0").write_bytes(b"\x7fELF not really")
    (host / "firmware/gsp.bin").write_bytes(b"host firmware")
    (host / "etc/ld.so.conf.d/host.conf").write_text("/host/lib\n")
    (host / "etc/ld.so.cache").write_bytes(b"host cache")
    (host / "secret").write_text("host secret\n")
    os.chmod(host / "secret", 0o600)
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.1").write_bytes(b"driver library")
    (driver / "gsp.bin").write_bytes(b"driver firmware")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    s = Scene(host, driver, root)
    s.freeze()
    yield s
    s.assert_host_untouched()


@pytest.fixture
def capless_pid():
    """A root process without capabilities whose root is the host's "/".

    Its /proc/<pid>/root is reachable even by a process with few capabilities
    (the ptrace access check compares capability sets), as on a node where
    the container shares the host's PID namespace.
    """
    pid = os.fork()
    if pid == 0:
        try:
            drop_capabilities(set())
            os.execv("/bin/sleep", ["sleep", "120"])
        finally:
            os._exit(127)
    yield pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.fixture(scope="session")
def shared_library(tmp_path_factory) -> Path:
    """A real shared library, libnvctfoo.so.1.0 with SONAME libnvctfoo.so.1."""
    if shutil.which("gcc") is None:
        skip("needs gcc")
    out = tmp_path_factory.mktemp("lib") / "libnvctfoo.so.1.0"
    src = out.with_suffix(".c")
    src.write_text("int nvctfoo(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvctfoo.so.1", "-o", str(out),
                    str(src)], check=True)
    return out


@pytest.fixture(scope="session")
def toolkits(tmp_path_factory, sim_node):
    """runtime -> a toolkit installed with ``nvct toolkit install`` for the simulated node (once each)."""
    from tests.support.toolkit_runs import install

    installed: dict = {}

    def get(runtime: str):
        if runtime not in installed:
            installed[runtime] = install(str(tmp_path_factory.mktemp(f"toolkit-{runtime}")), sim_node, runtime)
        return installed[runtime]

    return get


@pytest.fixture(scope="session")
def deb_nodes(tmp_path_factory, sim_node):
    """runtime -> nvct from the project's .deb, installed once in a private root for the simulated node."""
    from tests.support.deb_runs import install_deb

    with install_deb(tmp_path_factory, sim_node) as get:
        yield get
