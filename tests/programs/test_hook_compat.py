"""enable-cuda-compat decides by the compat libcuda's ``.note.cuda.fwd_compatibility``.

One libcuda per case carries a real note (tests/support/compat.py): the
host's branch listed or not, an equal or older driver, a newer CUDA, the
device (brand) list, a note that is not JSON, no note at all. What a container
then loads is shown through runc and crun in tests/e2e/test_cuda_compat.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from nvct.base.errors import NvctError
from nvct.edits.steps import parse_step
from nvct.hooks.compat import compat_choice
from nvct.linux import elf
from nvct.rootfs.root import Rootfs
from tests.support.compat import NOTE_575, NOTE_590, make_compat_libcuda, note_section

pytestmark = pytest.mark.skipif(not shutil.which("objcopy"), reason="needs objcopy (binutils)")

SOURCE = "/bin/true"  # any ELF file: the decision reads only the note


def _root(tmp_path, note, version="575.57.08", folder="usr/local/cuda/compat"):
    root = tmp_path / "root"
    make_compat_libcuda(SOURCE, str(root / folder / f"libcuda.so.{version}"), note)
    return Rootfs(str(root))


def _choice(root, *argv):
    return compat_choice(root, parse_step("enable-cuda-compat", list(argv)))


def test_the_note_is_read_from_the_section(tmp_path):
    lib = make_compat_libcuda(SOURCE, str(tmp_path / "libcuda.so.575.57.08"), NOTE_575)
    fd = os.open(lib, os.O_RDONLY)
    try:
        assert elf.cuda_compat_note(fd, lib) == NOTE_575
    finally:
        os.close(fd)
    fd = os.open(SOURCE, os.O_RDONLY)
    try:
        assert elf.cuda_compat_note(fd, SOURCE) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("host, used", [
    ("570.211.01", True),    # listed branch, older driver
    ("575.10.10", True),     # same branch, older driver
    ("575.57.08", False),    # the same driver
    ("575.99.99", False),    # same branch, newer driver
    ("590.44.01", False),    # a branch the note does not list: CUDA error 804 if used
    ("525.60.13", False),    # an older branch the note does not list (the old rule said yes)
])
def test_the_host_branch_must_be_listed_and_older(tmp_path, host, used):
    folder, why = _choice(_root(tmp_path, NOTE_575), "--host-driver-version", host)
    assert (folder == "/usr/local/cuda/compat") is used, why
    if host.startswith(("590", "525")):
        assert "804" in why and "535, 550, 560, 565, 570, 575" in why


@pytest.mark.parametrize("host_cuda, used", [("12.8", True), ("12.9", False), ("12.10", False), ("13.0", False)])
def test_without_a_driver_version_the_cuda_versions_decide(tmp_path, host_cuda, used):
    folder, why = _choice(_root(tmp_path, NOTE_575), "--host-cuda-version", host_cuda)
    assert (folder is not None) is used, why


def test_a_newer_cuda_package_on_an_older_listed_branch(tmp_path):
    root = _root(tmp_path, NOTE_590, version="590.44.01")
    assert _choice(root, "--host-driver-version=580.65.06", "--host-cuda-version=13.0")[0] is not None
    assert _choice(root, "--host-driver-version=560.35.03")[0] is None  # 560 is not in 590's list


def test_the_device_list_must_name_every_gpu_brand(tmp_path):
    root = _root(tmp_path, NOTE_575)
    assert _choice(root, "--host-driver-version=570.1.1", "--gpu-brand=2", "--gpu-brand=14")[0] is not None
    folder, why = _choice(root, "--host-driver-version=570.1.1", "--gpu-brand=2", "--gpu-brand=5")
    assert folder is None and "not list the GPU brand 5 (" in why  # a GeForce among the GPUs
    assert _choice(root, "--host-driver-version=570.1.1")[0] is not None  # brands unknown: not checked


def test_the_container_root_flag_names_the_folder(tmp_path):
    root = _root(tmp_path, NOTE_575, folder="usr/local/cuda/compat-other")
    assert _choice(root, "--host-driver-version=570.1.1")[0] is None
    assert _choice(root, "--host-driver-version=570.1.1", "--cuda-compat-container-root",
                   "/usr/local/cuda/compat-other")[0] == "/usr/local/cuda/compat-other"


def test_without_a_note_the_driver_major_decides(tmp_path):
    root = _root(tmp_path, None, version="580.65.06")
    assert _choice(root, "--host-driver-version=550.54.15")[0] is not None
    assert _choice(root, "--host-driver-version=580.1.1")[0] is None
    assert _choice(root, "--host-cuda-version=12.4")[0] is None  # nothing to compare


def test_a_note_that_is_not_json_falls_back_with_a_warning(tmp_path, capsys):
    root = tmp_path / "root"
    lib = root / "usr/local/cuda/compat/libcuda.so.580.65.06"
    make_compat_libcuda(SOURCE, str(lib), NOTE_575)
    data = bytearray(lib.read_bytes())
    at = data.index(b'{"format"')
    data[at] = ord("[")  # the JSON broken in place
    lib.write_bytes(bytes(data))
    assert _choice(Rootfs(str(root)), "--host-driver-version=550.54.15")[0] is not None
    assert "not JSON" in capsys.readouterr().err


def test_a_hostile_note_is_bounded(tmp_path):
    """A note header claiming huge sizes never reads past the section or loops."""
    import struct

    blob = struct.pack("<III", 0xFFFFFFF0, 0xFFFFFFF0, 1) + note_section(NOTE_575)
    src = tmp_path / "blob"
    src.write_bytes(blob)
    lib = tmp_path / "libcuda.so.1.1"
    subprocess.run(["objcopy", "--add-section", f".note.cuda.fwd_compatibility={src}", SOURCE, str(lib)], check=True)
    fd = os.open(lib, os.O_RDONLY)
    try:
        assert elf.cuda_compat_note(fd, str(lib)) is None
    finally:
        os.close(fd)
    lib.write_bytes(b"\x7fELF\x02\x01" + b"\0" * 58)
    fd = os.open(lib, os.O_RDONLY)
    try:
        assert elf.cuda_compat_note(fd, str(lib)) is None  # no section headers
    finally:
        os.close(fd)
    lib.write_bytes(b"not an elf" * 10)
    fd = os.open(lib, os.O_RDONLY)
    try:
        with pytest.raises(NvctError, match="not an ELF file"):
            elf.cuda_compat_note(fd, str(lib))
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the simulated node)")
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
@pytest.mark.parametrize("branches, verdict", [([535, 550], "used: "), ([570, 575], "not used: ")])
def test_explain_says_why_compat_was_or_was_not_chosen(sim_node, tmp_path, mode, branches, verdict):
    """The error-804 question (is the image's compat libcuda used on this host, and why) in nvct explain."""
    from nvct.config import file as config_mod
    from nvct.doctor import explain, explainview
    from nvct.oci import spec as ocispec
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    rootfs = make_rootfs(str(tmp_path))
    make_compat_libcuda(SOURCE, os.path.join(rootfs, "usr/local/cuda/compat/libcuda.so.575.57.08"),
                        {"Format": 1, "CUDA Version": "12.9", "Driver": branches, "Device": [2, 14]})
    request = "nvidia.com/gpu=0" if mode == "cdi" else "0"
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES={request}"])
    config = config_mod.load(sim_node["config"], env={})
    config.data["nvidia-container-runtime"]["mode"] = mode
    if mode == "cdi":
        from tests.support.gpu_runs import spec_dir

        config.data["nvidia-container-runtime"].setdefault("modes", {})["cdi"] = {
            "spec-dirs": [spec_dir(tmp_path, sim_node)]}
    result = explain.explain(ocispec.load(str(bundle)), config, bundle=str(bundle))
    assert result.error is None, result.error
    assert result.compat.startswith(verdict), result.compat
    assert "libcuda.so.575.57.08" in result.compat
    if verdict == "not used: ":
        assert "not the host's 550" in result.compat and "804" in result.compat
    assert f"cuda compat: {result.compat}" in explainview.render_text(result)
    assert explainview.to_json(result)["cuda_compat"] == result.compat


@pytest.mark.parametrize("plant", ["fifo", "escaping-link", "directory"])
def test_a_libcuda_that_is_no_file_in_the_root_is_not_used(tmp_path, plant):
    """A hostile image's compat "libcuda" (a FIFO, a link out of the root, a directory) is never
    opened outside the root, never blocks, and is not used; the start goes on."""
    root = tmp_path / "root"
    folder = root / "usr/local/cuda/compat"
    folder.mkdir(parents=True)
    lib = folder / "libcuda.so.999.1.1"
    if plant == "fifo":
        os.mkfifo(lib)
    elif plant == "escaping-link":
        os.symlink(f"../../../../../../..{SOURCE}", lib)  # the host's file, were it followed out
    else:
        lib.mkdir()
    folder_path, why = _choice(Rootfs(str(root)), "--host-driver-version=550.54.15")
    assert folder_path is None and "cannot be read" in why, why
