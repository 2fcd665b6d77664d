"""Mount namespaces: mountinfo parsing, and work done in forked children."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from nvct.base.errors import ContainerError, RequestError
from nvct.linux import namespaces
from nvct.linux.fs import mount
from nvct.linux.namespaces import (
    in_mount_namespace_of,
    in_private_mount_namespace,
    in_same_mount_namespace,
    mount_namespace_id,
    mounts,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, mount)")


def test_mounts_lists_the_root_mount():
    points = [m.mount_point for m in mounts()]
    assert "/" in points
    proc = [m for m in mounts() if m.mount_point == "/proc"]
    assert proc and proc[-1].fstype == "proc"


def test_mountinfo_escapes_are_decoded():
    assert namespaces._unescape(r"/a\040b\011c\134d") == "/a b\tc\\d"
    assert namespaces._unescape("/plain") == "/plain"
    assert namespaces._unescape("/odd\\x") == "/odd\\x"


def test_same_namespace_as_itself():
    assert in_same_mount_namespace(os.getpid())
    assert mount_namespace_id() == mount_namespace_id(os.getpid())


def test_unknown_pid_is_a_container_error():
    with pytest.raises(ContainerError, match="mount namespace of pid 999999999"):
        mount_namespace_id(999999999)
    with pytest.raises(ContainerError, match="mount namespace of pid 999999999"):
        in_mount_namespace_of(999999999, os.getpid)


def test_entering_the_namespace_we_are_in_is_a_no_op():
    assert in_mount_namespace_of(os.getpid(), mount_namespace_id) == mount_namespace_id()


def test_child_result_comes_back():
    assert namespaces.run_in_child(None, lambda a, b=0: (a, b, os.getpid()), 1, b=2)[:2] == (1, 2)


def test_nvct_errors_keep_their_class():
    def fail():
        raise RequestError("bad request NVIDIA_VISIBLE_DEVICES")

    with pytest.raises(RequestError, match="bad request NVIDIA_VISIBLE_DEVICES"):
        namespaces.run_in_child(None, fail)


def test_other_errors_become_one_line_container_errors():
    def fail():
        raise ValueError("two\nlines")

    with pytest.raises(ContainerError, match="^ValueError: two lines$"):
        namespaces.run_in_child(None, fail)
    with pytest.raises(ContainerError, match="^FileNotFoundError: /nonexistent: No such"):
        namespaces.run_in_child(None, os.stat, "/nonexistent")


def test_a_child_killed_by_a_signal_is_reported():
    with pytest.raises(ContainerError, match="killed by signal 9"):
        namespaces.run_in_child(None, lambda: os.kill(os.getpid(), signal.SIGKILL))


def test_unpicklable_results_are_an_error():
    with pytest.raises(ContainerError, match="does not pickle"):
        namespaces.run_in_child(None, lambda: (lambda: None))


@needs_root
def test_private_namespace_mounts_stay_private(tmp_path):
    def work():
        mount("tmpfs", str(tmp_path), "tmpfs", 0)
        open(tmp_path / "inside", "w").close()
        return mount_namespace_id(), os.listdir(tmp_path)

    ns, names = in_private_mount_namespace(work)
    assert names == ["inside"]
    assert ns != mount_namespace_id()
    assert os.listdir(tmp_path) == []
    assert not any(m.mount_point == str(tmp_path) for m in mounts())


@needs_root
def test_in_mount_namespace_of_sees_that_namespace(tmp_path):
    # A process in its own mount namespace with a tmpfs only it can see.
    script = f"mount -t tmpfs none {tmp_path} && touch {tmp_path}/marker && echo ready && " \
             "exec sleep 60"
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert not in_same_mount_namespace(proc.pid)
        assert in_mount_namespace_of(proc.pid, os.listdir, str(tmp_path)) == ["marker"]
        assert in_mount_namespace_of(proc.pid, in_same_mount_namespace, proc.pid)
        # this process never moved
        assert os.listdir(tmp_path) == []
        assert in_same_mount_namespace(os.getpid())
    finally:
        proc.kill()
        proc.wait()
