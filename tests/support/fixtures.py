"""Pytest fixtures for tests that run real containers.

Import the ones you need into a conftest.py::

    from tests.support.fixtures import rootfs, oci_runtime, private_dockerd  # noqa: F401

Each fixture skips (with the reason) when not root or a binary is missing;
in CI everything is installed and runs as root, so nothing is skipped there.
Daemons are per test module: cheap enough (well under a second to start)
and no test sees another module's runtimes or containers.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from . import cgroupfix
from .containerd import CONTAINERD, CTR, K8S_NAMESPACE, RUNC, Containerd
from .docker import DOCKER, DOCKERD, Dockerd
from .image import SLEEP_FOREVER, build_image_tar
from .podman import PODMAN, Podman
from .rootfs import BUSYBOX, as_root, base_rootfs, make_rootfs
from .runtimes import RUNTIMES

__all__ = [
    "busybox_image_tar", "pause_image_tar", "rootfs", "oci_runtime",
    "private_dockerd", "private_containerd", "private_podman",
    "need_root", "need_binaries", "need_rootfs_tools",
]

#: The image every client has loaded.
BUSYBOX_IMAGE = "nvct/busybox:latest"
BUSYBOX_IMAGE_QUALIFIED = "docker.io/nvct/busybox:latest"
#: The CRI sandbox image (busybox sleeping forever).
PAUSE_IMAGE = "nvct/pause:latest"
#: The CRI runtime handler every private containerd has, pointing at runc.
RUNC_HANDLER = "runc2"


def skip(reason: str):
    """The one way a test says what it lacks: a skip here, a failure in CI (``NVCT_CI_NO_SKIP``),
    where everything a test needs is installed and nothing may be skipped."""
    if os.environ.get("NVCT_CI_NO_SKIP"):
        pytest.fail(f"would skip in CI: {reason}", pytrace=False)
    else:
        pytest.skip(reason)


def need_root(what: str = "runs containers") -> None:
    if os.geteuid() != 0:
        skip(f"needs root ({what})")


def need_binaries(*paths: str) -> None:
    missing = [p for p in paths if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if missing:
        skip(f"needs {', '.join(missing)} (not installed)")


def need_module(name: str, why: str) -> None:
    """Skip (a failure in CI) unless Python module ``name`` imports."""
    import importlib

    try:
        importlib.import_module(name)
    except ImportError:
        skip(f"needs the Python module {name} ({why})")


def need_rootfs_tools() -> None:
    """Skip unless the test rootfs can be built: binaries, gcc, and chroot rights."""
    need_binaries(BUSYBOX, "/sbin/ldconfig")
    if shutil.which("gcc") is None:
        skip("needs gcc (compiles dlopen-probe)")
    if os.geteuid() != 0 and subprocess.run(
            [*as_root(), "true"], capture_output=True).returncode != 0:
        skip("needs root or unprivileged user namespaces (ldconfig -r chroots)")


@pytest.fixture(scope="session")
def busybox_image_tar(tmp_path_factory) -> str:
    """``nvct/busybox:latest`` (Cmd sh) as a docker-archive + OCI layout tarball."""
    need_rootfs_tools()
    out = tmp_path_factory.mktemp("images") / "busybox.tar"
    build_image_tar(base_rootfs(), out, "nvct/busybox", "latest")
    return str(out)


@pytest.fixture(scope="session")
def pause_image_tar(tmp_path_factory) -> str:
    """``nvct/pause:latest``: same layer, entrypoint sleeps forever (CRI sandbox)."""
    need_rootfs_tools()
    out = tmp_path_factory.mktemp("images") / "pause.tar"
    build_image_tar(base_rootfs(), out, "nvct/pause", "latest", cmd=(),
                    entrypoint=SLEEP_FOREVER)
    return str(out)


@pytest.fixture
def rootfs(tmp_path) -> str:
    """A private copy of the base rootfs (``tmp_path/rootfs``): hooks may write into it."""
    need_rootfs_tools()
    return make_rootfs(tmp_path)


@pytest.fixture(params=sorted(RUNTIMES))
def oci_runtime(request) -> list[str]:
    """argv of runc, then of crun (the test runs once with each)."""
    need_root()
    argv = RUNTIMES[request.param]
    need_binaries(argv[0])
    if request.param == "crun":
        cgroupfix.ensure_crun_works()
    return list(argv)


@pytest.fixture(scope="module")
def private_dockerd(busybox_image_tar):
    """A private dockerd (default config) with ``nvct/busybox`` loaded."""
    need_root()
    need_binaries(DOCKERD, DOCKER, RUNC)
    with Dockerd() as dockerd:
        dockerd.load(busybox_image_tar)
        yield dockerd


@pytest.fixture(scope="module")
def private_containerd(busybox_image_tar, pause_image_tar):
    """A private containerd with both images in ``default`` and ``k8s.io``,
    and the CRI runtime handler ``runc2`` -> runc."""
    need_root()
    need_binaries(CONTAINERD, CTR, RUNC)
    with Containerd(runtimes={RUNC_HANDLER: RUNC}) as containerd:
        for namespace in ("default", K8S_NAMESPACE):
            containerd.import_image(busybox_image_tar, namespace)
            containerd.import_image(pause_image_tar, namespace)
        yield containerd


@pytest.fixture(scope="module")
def private_podman(busybox_image_tar):
    """Podman with private config and storage (crun by default), ``nvct/busybox`` loaded."""
    need_root()
    need_binaries(PODMAN, RUNTIMES["crun"][0], RUNC)
    cgroupfix.ensure_crun_works()
    with Podman() as podman:
        podman.load(busybox_image_tar)
        yield podman
