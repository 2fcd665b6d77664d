"""The node root: its mirror comes from this machine's apt, and commands run in it as on a node."""

from __future__ import annotations

import os

import pytest

from tests.support import noderoot
from tests.support.fixtures import need_binaries, need_root


def _sources(tmp_path, name: str, text: str) -> str:
    d = tmp_path / "sources.list.d"
    d.mkdir(exist_ok=True)
    (d / name).write_text(text)
    return str(d)


@pytest.fixture
def bookworm(monkeypatch):
    monkeypatch.setattr(noderoot, "_os_release", lambda: {"VERSION_CODENAME": "bookworm"})


def test_mirror_from_deb822_sources_skips_security_and_disabled(tmp_path, bookworm):
    d = _sources(tmp_path, "debian.sources", """\
Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Enabled: no

Types: deb deb-src
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
""")
    assert noderoot.apt_mirror((str(tmp_path / "none.list"), d)) == "http://mirror.example/debian"


def test_mirror_from_a_one_line_sources_list(tmp_path, bookworm):
    path = tmp_path / "sources.list"
    path.write_text("# deb http://old.example/debian bookworm main\n"
                    "deb http://sec.example/debian-security bookworm-security main\n"
                    "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib\n")
    assert noderoot.apt_mirror((str(path),)) == "http://one.example/debian"


def test_no_mirror_for_this_release_is_one_line_naming_the_way_out(tmp_path, bookworm):
    d = _sources(tmp_path, "other.list", "deb http://x.example/ubuntu jammy main\n")
    with pytest.raises(noderoot.NodeRootError, match="no apt source for bookworm in .*: set NVCT_NODEROOT_MIRROR"):
        noderoot.apt_mirror((d,))


@pytest.fixture(scope="module")
def node():
    need_root("builds and enters a node root")
    need_binaries("/usr/bin/mmdebstrap", "/usr/bin/nsenter", "/usr/bin/unshare")
    with noderoot.NodeRoot(noderoot.cached_node_root()) as n:
        yield n


@pytest.mark.containers
def test_commands_run_in_the_root_with_its_own_engines(node):
    versions = noderoot.package_versions(node.root, ["containerd", "runc", "crun", "docker.io"])
    assert int(versions["containerd"].split(".")[0]) >= 2, versions
    out = node.run(["sh", "-c", "containerd --version; runc --version | head -1; "
                                "cat /proc/1/comm; readlink /proc/self/root; stat -c %m /"]).check().stdout
    lines = out.splitlines()
    assert lines[0].split()[2].startswith("2."), out  # the root's containerd, not the host's 1.6
    assert lines[1].startswith("runc version 1.") and not lines[1].startswith("runc version 1.1"), out
    assert lines[3:] == ["/", "/"], out  # the root is its namespace's own root (pivot_root, not chroot)


@pytest.mark.containers
def test_tmp_is_shared_run_is_private_and_the_checkout_read_only(node, tmp_path):
    (tmp_path / "from-host").write_text("seen\n")
    marker = f"/run/nvct-noderoot-{os.getpid()}"
    node.run(["sh", "-c", f"cat {tmp_path}/from-host; touch {marker}"]).check()
    assert not os.path.exists(marker)  # the host's /run is untouched
    assert node.run(["test", "-e", marker]).ok
    refused = node.run(["touch", os.path.join(noderoot.CHECKOUT, "nvct", "written-from-the-root")])
    assert not refused.ok and "Read-only file system" in refused.stderr, refused.describe()


@pytest.mark.containers
def test_nvct_runs_from_the_checkout_under_the_roots_python(node):
    result = node.nvct("--version").check()
    assert result.stdout.startswith("nvct, version"), result.describe()
    where = node.run(["python3", "-I", "-c", "import nvct, sys; print(nvct.__file__, sys.version_info[:2])"]).check()
    path, version = where.stdout.split(" ", 1)
    assert path == os.path.join(noderoot.CHECKOUT, "nvct", "__init__.py")
    assert version.strip() != "(3, 11)", where.stdout  # the root's interpreter, not the host's


@pytest.mark.containers
def test_dockerd_of_the_root_runs_a_container(node, busybox_image_tar):
    """For the CDI-routed ``--gpus`` of docker 28: its dockerd (and containerd 2.1) run in the root."""
    from tests.support.docker import Dockerd

    with Dockerd(wrapper=node.prefix) as dockerd:
        version = dockerd.docker(["version", "--format", "{{.Server.Version}}"]).check().stdout
        dockerd.load(busybox_image_tar)
        result = dockerd.run(["--rm", "nvct/busybox", "echo", "from docker 28"])
    assert int(version.split(".")[0]) >= 28, version
    assert result.ok and result.stdout == "from docker 28\n", result.describe()
