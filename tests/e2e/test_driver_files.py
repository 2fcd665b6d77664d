"""A current driver's files, seen from inside real containers (runc and crun, legacy and jit-cdi).

Driver 580 ships NVVM 7.0 (``libnvidia-nvvm70.so.4``), the EGL platform libraries
wayland2, xcb and xlib with their JSON, and the IMEX daemon and its control tool.
GSP firmware is found where the kernel's loader looks: ``firmware_class.path``
first, then ``/lib/firmware/updates/<kernel release>``, ``/lib/firmware``.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.fixtures import skip
from tests.support.gpu_runs import need_runtime, run_gpu, spec_dir

pytestmark = pytest.mark.containers

VERSION = "580.65.06"
LIB = "/usr/lib/x86_64-linux-gnu"
EGL = "/usr/share/egl/egl_external_platform.d"
FILES = (f"{LIB}/libnvidia-nvvm70.so.4", f"{LIB}/libnvidia-egl-wayland2.so.1", f"{LIB}/libnvidia-egl-xcb.so.1",
         f"{LIB}/libnvidia-egl-xlib.so.1", f"{EGL}/09_nvidia_wayland2.json", f"{EGL}/20_nvidia_xcb.json",
         f"{EGL}/20_nvidia_xlib.json", "/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl")


def _node(base) -> dict:
    if os.geteuid() != 0:
        skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import build_node

    return build_node(os.path.join(str(base), "node"), driver_version=VERSION, mig=False, gpus=2)


@pytest.fixture(scope="module")
def node580(tmp_path_factory):
    return _node(tmp_path_factory.mktemp("drv580"))


def _see(paths) -> str:
    return " ".join(f'[ -e {p} ] && echo "have {p}" || echo "missing {p}";' for p in paths)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_current_driver_files_reach_the_container(tmp_path, rootfs, node580, runtime, mode):
    need_runtime(runtime)
    result = run_gpu(tmp_path, node580, rootfs, mode=mode, runtime=runtime, command=_see(FILES),
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"])
    assert result.ok, result.describe()
    assert "missing" not in result.stdout, result.stdout


def _move_firmware(root: str, to: str) -> list[str]:
    """The node's GSP firmware moved from /lib/firmware/nvidia/<version> to ``to``/nvidia/<version>."""
    src = os.path.join(root, "lib/firmware/nvidia", VERSION)
    dst = os.path.join(root, to.lstrip("/"), "nvidia", VERSION)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.move(src, dst)
    return [f"{to}/nvidia/{VERSION}/{name}" for name in sorted(os.listdir(dst))]


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("where", ["updates", "firmware_class.path"])
def test_gsp_firmware_where_the_kernel_loader_looks(tmp_path, rootfs, runtime, where):
    need_runtime(runtime)
    node = _node(tmp_path / "sim")
    root = node["roots"]["driver_root"]
    if where == "updates":
        firmware = _move_firmware(root, f"/lib/firmware/updates/{os.uname().release}")
    else:
        firmware = _move_firmware(root, "/opt/site-firmware")
        param = os.path.join(os.path.dirname(node["roots"]["proc_root"]), "sys/module/firmware_class/parameters")
        os.makedirs(param, exist_ok=True)
        with open(os.path.join(param, "path"), "w") as f:
            f.write("/opt/site-firmware\n")
    assert firmware
    result = run_gpu(tmp_path, node, rootfs, mode="jit-cdi", runtime=runtime, command=_see(firmware),
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"])
    assert result.ok, result.describe()
    assert "missing" not in result.stdout and result.stdout.count("have ") == len(firmware), result.stdout


MUSL_PATH = f"/etc/ld-musl-{os.uname().machine}.path"


def _musl(rootfs: str) -> None:
    """The image made musl (Alpine's loader at /lib/ld-musl-<arch>.so.1)."""
    with open(os.path.join(rootfs, "lib", f"ld-musl-{os.uname().machine}.so.1"), "wb") as f:
        f.write(b"\x7fELF simulated musl loader")


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_musl_image_finds_the_driver_libraries_by_its_path_file(tmp_path, rootfs, sim_node, runtime, mode):
    need_runtime(runtime)
    _musl(rootfs)
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=f"cat {MUSL_PATH}",
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"])
    assert result.ok, result.describe()
    entries = result.stdout.split()
    assert entries[0] == "/usr/lib/x86_64-linux-gnu" and entries[1:] == ["/lib", "/usr/local/lib", "/usr/lib"], \
        result.stdout


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_musl_path_file_keeps_the_images_folders_and_never_follows_a_link(tmp_path, rootfs, sim_node, runtime):
    need_runtime(runtime)
    _musl(rootfs)
    target = tmp_path / "host-file"
    target.write_text("host\n")
    os.symlink(str(target), os.path.join(rootfs, MUSL_PATH.lstrip("/")))
    result = run_gpu(tmp_path, sim_node, rootfs, mode="jit-cdi", runtime=runtime, command=f"cat {MUSL_PATH}",
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute"])
    assert result.ok, result.describe()
    assert target.read_text() == "host\n"
    assert not os.path.islink(os.path.join(rootfs, MUSL_PATH.lstrip("/")))
    # an image's own path file: its folders stay, after the driver's
    (tmp_path / "again").mkdir()
    with open(os.path.join(rootfs, MUSL_PATH.lstrip("/")), "w") as f:
        f.write("/opt/app/lib:/lib\n/usr/lib\n")
    result = run_gpu(tmp_path / "again", sim_node, rootfs, mode="jit-cdi", runtime=runtime,
                     command=f"cat {MUSL_PATH}",
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute"])
    assert result.ok, result.describe()
    assert result.stdout.split() == ["/usr/lib/x86_64-linux-gnu", "/opt/app/lib", "/lib", "/usr/lib"], result.stdout


DEBIAN_DIR = f"{LIB}/nvidia/current"


def _debian_layout(root: str) -> None:
    """Debian's packaging: the driver libraries in <multiarch>/nvidia/current, named by an ld.so.conf.d
    entry, and the node's ld cache rebuilt by the real ldconfig."""
    from nvct.simulate import ldcache

    src, dst = os.path.join(root, LIB.lstrip("/")), os.path.join(root, DEBIAN_DIR.lstrip("/"))
    os.makedirs(dst)
    for name in os.listdir(src):
        if name.startswith(("libcuda.", "libnvidia-ml.", "libnvidia-ptxjitcompiler.")):
            shutil.move(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(root, "etc/ld.so.conf.d/nvidia.conf"), "w") as f:
        f.write(DEBIAN_DIR + "\n")
    ldcache.generate(root)


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
def test_driver_libraries_under_debians_nvidia_current(tmp_path, rootfs, runtime, mode):
    """Found through the node's ld cache (ld.so.conf.d), mounted where they are, found by SONAME inside."""
    need_runtime(runtime)
    node = _node(tmp_path / "sim")
    _debian_layout(node["roots"]["driver_root"])
    script = (f"ls {DEBIAN_DIR}/libcuda.so.1 {DEBIAN_DIR}/libnvidia-ml.so.1 && "
              "grep -c nvidia/current /etc/ld.so.conf.d/*nvct*.conf && "
              "grep -c nvidia/current/libcuda.so.1 /etc/ld.so.cache")
    result = run_gpu(tmp_path, node, rootfs, mode=mode, runtime=runtime, command=script,
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"])
    assert result.ok, result.describe()


@pytest.fixture(scope="module")
def node_in_own_folder(tmp_path_factory):
    """The driver's utilities in /usr/local/nvidia/bin and a wrapper script of the same name in
    /usr/bin, as on a real H200 node: only PATH says which is the driver's."""
    node = _node(tmp_path_factory.mktemp("ownfolder"))
    bin_dir = os.path.join(node["roots"]["driver_root"], "usr/local/nvidia/bin")
    os.makedirs(bin_dir)
    smi = os.path.join(node["roots"]["driver_root"], "usr/bin/nvidia-smi")
    shutil.move(smi, os.path.join(bin_dir, "nvidia-smi"))
    with open(smi, "w") as f:
        f.write("#!/bin/sh\necho wrapper\n")
    os.chmod(smi, 0o755)
    return node


@pytest.mark.parametrize("runtime", ["runc", "crun"])
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
def test_utilities_come_from_the_folder_path_names_first(tmp_path, rootfs, node_in_own_folder, runtime, mode,
                                                         monkeypatch):
    need_runtime(runtime)
    monkeypatch.setenv("PATH", f"/usr/local/nvidia/bin:{os.environ['PATH']}")
    if mode == "cdi":
        spec_dir(tmp_path, node_in_own_folder)  # generated under that PATH
    result = run_gpu(tmp_path, node_in_own_folder, rootfs, mode=mode, runtime=runtime,
                     env=["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
                     command="head -c4 /usr/local/nvidia/bin/nvidia-smi | tail -c3; echo; "
                             "[ -e /usr/bin/nvidia-smi ] && echo wrapper-too || echo no-wrapper")
    assert result.ok, result.describe()
    assert result.stdout.split() == ["ELF", "no-wrapper"], result.describe()
