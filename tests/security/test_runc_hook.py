"""End to end under runc: a prestart hook realizes edits with Rootfs in the container.

The hook runs in the host's mount namespace, as runc's prestart hooks do; it
enters the container's namespace in a child (in_mount_namespace_of) and works
there. The container then sees the edits; the host sees nothing. With a
hostile image the hook fails and runc refuses to start the container.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import nvct

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runc)"),
    pytest.mark.skipif(shutil.which("runc") is None, reason="needs runc"),
    pytest.mark.skipif(not os.path.exists("/bin/busybox"), reason="needs busybox-static"),
]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(nvct.__file__)))
LIB = "/usr/lib/x86_64-linux-gnu"

HOOK = """
import json, sys
sys.path.insert(0, {repo!r})
from nvct.base.errors import NvctError
from nvct.linux.namespaces import in_mount_namespace_of
from nvct.linux.privileges import sanitize_environ
from nvct.rootfs.root import Rootfs

sanitize_environ()
state = json.load(sys.stdin)

def realize():
    with Rootfs({root!r}) as r:
        r.mknod("/dev/nvct-null", "c", 1, 3, 0o666)
        r.bind_mount({driver!r}, "{lib}/libcuda.so.1")
        r.symlink("libcuda.so.1", "{lib}/libcuda.so")

try:
    in_mount_namespace_of(state["pid"], realize)
except NvctError as e:
    print(e, file=sys.stderr)
    sys.exit(3)
"""


def _run_container(scene, tmp_path):
    root = scene.root
    (root / "bin").mkdir()
    shutil.copy("/bin/busybox", root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    for d in ("dev", "proc", "sys", "tmp"):
        (root / d).mkdir(exist_ok=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK.format(repo=REPO, root=str(root), lib=LIB,
                                driver=str(scene.driver / "libcuda.so.1")))
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["root"] = {"path": str(root), "readonly": True}
    spec["process"]["terminal"] = False
    spec["process"]["args"] = [
        "/bin/sh", "-c", f"cat {LIB}/libcuda.so; echo; ls -l /dev/nvct-null; "
        "echo x > /dev/nvct-null && echo device-ok"]
    spec["hooks"] = {"prestart": [{"path": sys.executable,
                                   "args": ["python3", "-I", str(hook)], "env": []}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    cid = f"nvct-sec-{os.urandom(4).hex()}"
    state = tmp_path / "runc-state"
    try:
        return subprocess.run(["runc", "--root", str(state), "run", "--bundle", str(bundle),
                               cid], capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["runc", "--root", str(state), "delete", "--force", cid],
                       capture_output=True)


def test_edits_show_up_in_the_container_only(scene, tmp_path):
    (scene.root / LIB.lstrip("/")).mkdir(parents=True)
    result = _run_container(scene, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "driver library"
    assert lines[1].startswith("crw-rw-rw-") and "1,   3" in lines[1]
    assert lines[2] == "device-ok"
    # the mounts lived in the container's namespace: the image dir has empty stubs
    assert (scene.root / LIB.lstrip("/") / "libcuda.so.1").read_bytes() == b""
    assert not (scene.root / "dev/nvct-null").exists()  # made on the container's /dev
    scene.assert_host_untouched()


def test_a_hostile_image_makes_the_hook_fail_not_escape(scene, tmp_path):
    scene.link(LIB, "relative", scene.host / "lib")
    result = _run_container(scene, tmp_path)
    assert result.returncode != 0
    assert "dangling symlink" in result.stderr
    scene.assert_host_untouched()
