from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
from elftools.elf.elffile import ELFFile

from nvct.base.errors import NvctError
from nvct.config import file as config
from nvct.simulate import build_node, cached_node, load_manifest
from nvct.simulate.driver import CAPABILITY_LIBRARIES, driver

from .conftest import needs_root

LIB64 = "usr/lib/x86_64-linux-gnu"
LIB32 = "usr/lib/i386-linux-gnu"


def root_of(manifest):
    return manifest["roots"]["driver_root"]


def ldconfig_p(root):
    out = subprocess.run(["ldconfig", "-p", "-C", os.path.join(root, "etc/ld.so.cache")],
                         check=True, capture_output=True, text=True).stdout
    return {line.strip() for line in out.splitlines()[1:] if line.startswith("\t")}


def elf(path):
    with open(path, "rb") as f:
        e = ELFFile(f)
        dyn = e.get_section_by_name(".dynamic")
        tags = list(dyn.iter_tags()) if dyn else []
        notes = [n for s in e.iter_sections() if s["sh_type"] == "SHT_NOTE" for n in s.iter_notes()]
        return {
            "class": e.elfclass,
            "machine": e["e_machine"],
            "soname": next((t.soname for t in tags if t.entry.d_tag == "DT_SONAME"), None),
            "needed": [t.needed for t in tags if t.entry.d_tag == "DT_NEEDED"],
            "rpath": [t for t in tags if t.entry.d_tag in ("DT_RPATH", "DT_RUNPATH")],
            "notes": [(n["n_name"], n["n_type"], n["n_desc"]) for n in notes],
        }


# --- libraries and the ld.so.cache ---

@needs_root
@pytest.mark.parametrize("fixture", ["node550", "node535"])
def test_ld_cache_lists_every_driver_soname(request, fixture):
    m = request.getfixturevalue(fixture)
    root, ver = root_of(m), m["driver_version"]
    entries = ldconfig_p(root)
    drv = driver(ver)
    for lib in drv.libraries():
        soname = drv.soname(lib)
        in_cache_64 = f"{soname} (libc6,x86-64) => /{LIB64}/{soname}"
        in_cache_32 = f"{soname} (libc6) => /{LIB32}/{soname}"
        if lib.subdir:  # vdpau lives beside the cache, not in it
            assert in_cache_64 not in entries
            assert os.path.islink(os.path.join(root, LIB64, lib.subdir, soname))
            continue
        assert in_cache_64 in entries
        assert (in_cache_32 in entries) == lib.i386, soname
    assert f"libcuda.so (libc6,x86-64) => /{LIB64}/libcuda.so" in entries


@needs_root
def test_version_dependent_libraries(node550, node535):
    assert os.path.exists(os.path.join(root_of(node550), LIB64, "libnvidia-gpucomp.so.550.54.15"))
    assert os.path.exists(os.path.join(root_of(node535), LIB64, "libnvidia-gpucomp.so.535.161.08"))
    assert not any("libnvidia-compiler" in n for n in os.listdir(os.path.join(root_of(node550), LIB64)))


@needs_root
def test_files_links_and_modes(node550):
    d = os.path.join(root_of(node550), LIB64)
    st = os.lstat(os.path.join(d, "libcuda.so.550.54.15"))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert os.readlink(os.path.join(d, "libcuda.so.1")) == "libcuda.so.550.54.15"
    assert os.readlink(os.path.join(d, "libcuda.so")) == "libcuda.so.1"
    assert os.readlink(os.path.join(d, "libnvidia-nvvm.so")) == "libnvidia-nvvm.so.4"
    assert not os.path.lexists(os.path.join(d, "libnvidia-opencl.so"))
    assert not os.path.lexists(os.path.join(d, "libnvidia-glcore.so"))
    assert os.readlink(os.path.join(d, "libnvidia-egl-gbm.so.1")) == "libnvidia-egl-gbm.so.1.1.1"
    assert os.readlink(os.path.join(d, "gbm/nvidia-drm_gbm.so")) == "../libnvidia-allocator.so.1"
    xorg = os.path.join(root_of(node550), "usr/lib/xorg/modules")
    assert os.path.isfile(os.path.join(xorg, "drivers/nvidia_drv.so"))
    assert os.readlink(os.path.join(xorg, "extensions/libglxserver_nvidia.so")) == "libglxserver_nvidia.so.550.54.15"


@needs_root
def test_sonames_and_needed(node550):
    d = os.path.join(root_of(node550), LIB64)
    cuda = elf(os.path.join(d, "libcuda.so.550.54.15"))
    assert cuda["soname"] == "libcuda.so.1"
    assert cuda["needed"][:4] == ["libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"]
    assert elf(os.path.join(d, "libnvidia-encode.so.550.54.15"))["needed"][0] == "libnvcuvid.so.1"
    assert elf(os.path.join(d, "libGLX_nvidia.so.550.54.15"))["needed"][:2] == [
        "libnvidia-glcore.so.550.54.15", "libnvidia-tls.so.550.54.15"]
    assert elf(os.path.join(d, "libEGL_nvidia.so.550.54.15"))["needed"][:2] == [
        "libnvidia-eglcore.so.550.54.15", "libnvidia-glsi.so.550.54.15"]
    assert elf(os.path.join(d, "libGLESv2_nvidia.so.550.54.15"))["soname"] == "libGLESv2_nvidia.so.2"
    assert elf(os.path.join(d, "libnvidia-ml.so.550.54.15"))["soname"] == "libnvidia-ml.so.1"
    smi = elf(os.path.join(root_of(node550), "usr/bin/nvidia-smi"))
    assert "libnvidia-ml.so.1" in smi["needed"] and smi["rpath"] == []


@needs_root
def test_i386_libraries_are_32_bit_libc6(node550):
    d = os.path.join(root_of(node550), LIB32)
    info = elf(os.path.join(d, "libGLX_nvidia.so.550.54.15"))
    assert (info["class"], info["machine"], info["soname"]) == (32, "EM_386", "libGLX_nvidia.so.0")
    assert info["needed"] == ["libnvidia-glcore.so.550.54.15", "libnvidia-tls.so.550.54.15", "libc.so.6"]
    assert elf(os.path.join(d, "libcuda.so.550.54.15"))["needed"][:4] == [
        "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"]


@needs_root
@pytest.mark.parametrize("libdir", [LIB64, LIB32])
def test_tls_carries_the_abi_tag(node550, libdir):
    notes = elf(os.path.join(root_of(node550), libdir, "libnvidia-tls.so.550.54.15"))["notes"]
    abi = [desc for name, typ, desc in notes if typ == "NT_GNU_ABI_TAG"]
    assert abi and abi[0]["abi_os"] == "ELF_NOTE_OS_LINUX"
    assert (abi[0]["abi_major"], abi[0]["abi_minor"], abi[0]["abi_tiny"]) == (2, 3, 99)


@needs_root
def test_ld_so_conf_is_debian_multiarch(node550):
    root = root_of(node550)
    assert open(os.path.join(root, "etc/ld.so.conf")).read().startswith("include /etc/ld.so.conf.d/*.conf\n")
    x86 = open(os.path.join(root, "etc/ld.so.conf.d/x86_64-linux-gnu.conf")).read().splitlines()
    assert "/usr/lib/x86_64-linux-gnu" in x86 and "/lib/x86_64-linux-gnu" in x86
    i386 = open(os.path.join(root, "etc/ld.so.conf.d/i386-linux-gnu.conf")).read().splitlines()
    assert "/usr/lib/i386-linux-gnu" in i386 and "/usr/lib/i686-linux-gnu" in i386


# --- device nodes, /proc, other files ---

@needs_root
def test_device_nodes_have_real_numbers_and_modes(node550):
    root = root_of(node550)
    expected = {
        "/dev/nvidia0": (195, 0, 0o666), "/dev/nvidia7": (195, 7, 0o666), "/dev/nvidiactl": (195, 255, 0o666),
        "/dev/nvidia-modeset": (195, 254, 0o666), "/dev/nvidia-uvm": (510, 0, 0o666),
        "/dev/nvidia-uvm-tools": (510, 1, 0o666), "/dev/nvidia-caps/nvidia-cap1": (511, 1, 0o400),
        "/dev/nvidia-caps/nvidia-cap2": (511, 2, 0o444), "/dev/nvidia-caps/nvidia-cap12": (511, 12, 0o444),
        "/dev/nvidia-caps/nvidia-cap13": (511, 13, 0o444), "/dev/nvidia-caps/nvidia-cap21": (511, 21, 0o444),
        "/dev/nvidia-caps/nvidia-cap22": (511, 22, 0o444),
        "/dev/nvidia-caps-imex-channels/channel0": (509, 0, 0o666),
        "/dev/dri/card0": (226, 0, 0o660), "/dev/dri/renderD128": (226, 128, 0o660),
    }
    for path, (major, minor, mode) in expected.items():
        st = os.lstat(root + path)
        assert stat.S_ISCHR(st.st_mode), path
        assert (os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)) == (major, minor, mode), path
    assert stat.S_IMODE(os.stat(root + "/dev/nvidia-caps").st_mode) == 0o755
    assert os.readlink(root + "/dev/dri/by-path/pci-0000:1b:00.0-render") == "../renderD128"
    for node in node550["device_nodes"]:
        st = os.lstat(root + node["path"])
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (node["major"], node["minor"])
        assert f"{stat.S_IMODE(st.st_mode):04o}" == node["mode"]
    assert {n["role"] for n in node550["device_nodes"]} == {
        "gpu", "control", "modeset", "uvm", "mig-config", "mig-monitor", "mig-access", "imex-channel", "dri"}


@needs_root
def test_no_mig_means_no_access_caps(node535):
    caps = os.listdir(os.path.join(root_of(node535), "dev/nvidia-caps"))
    assert sorted(caps) == ["nvidia-cap1", "nvidia-cap2"]
    assert not os.path.exists(os.path.join(root_of(node535), "proc/driver/nvidia/capabilities/gpu0"))


@needs_root
def test_proc_files_on_disk(node550, node535):
    proc = node550["roots"]["proc_root"]
    info = open(os.path.join(proc, "driver/nvidia/gpus/0000:1b:00.0/information")).read()
    assert "GPU UUID: \t GPU-df222005-1a28-580c-823e-105777e89104\n" in info
    assert os.path.exists(os.path.join(proc, "driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access"))
    assert stat.S_IMODE(os.stat(os.path.join(proc, "driver/nvidia/capabilities/mig/config")).st_mode) == 0o400
    assert "195 nvidia\n" in open(os.path.join(proc, "devices")).read()
    assert "195 nvidia-frontend\n" in open(os.path.join(node535["roots"]["proc_root"], "devices")).read()
    assert open(os.path.join(proc, "driver/nvidia-caps/sys-minors")).read() == "fabric-imex-mgmt 1\n"


@needs_root
def test_ipc_firmware_and_vendor_files(node550):
    root = root_of(node550)
    for sock in ("run/nvidia-persistenced/socket", "run/nvidia-fabricmanager/socket"):
        st = os.lstat(os.path.join(root, sock))
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert os.readlink(os.path.join(root, "var/run")) == "../run"
    assert os.path.isdir(os.path.join(root, "tmp/nvidia-mps"))
    for fw in node550["firmware"]:
        with open(root + fw, "rb") as f:
            assert ELFFile(f)["e_machine"] == "EM_RISCV"
    icd = open(os.path.join(root, "usr/share/vulkan/icd.d/nvidia_icd.json")).read()
    assert icd.startswith('{\n    "file_format_version" : "1.0.0",\n    "ICD" : {\n')
    assert json.loads(icd)["ICD"] == {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"}
    layer = json.loads(open(os.path.join(root, "etc/vulkan/implicit_layer.d/nvidia_layers.json")).read())["layer"]
    assert layer["disable_environment"] == {"DISABLE_LAYER_NV_OPTIMUS_1": ""}
    assert json.load(open(os.path.join(root, "usr/share/glvnd/egl_vendor.d/10_nvidia.json")))["ICD"] == {
        "library_path": "libEGL_nvidia.so.0"}
    assert open(os.path.join(root, "etc/OpenCL/vendors/nvidia.icd")).read() == "libnvidia-opencl.so.1\n"
    profiles = json.load(open(os.path.join(root, "usr/share/nvidia/nvidia-application-profiles-550.54.15-rc")))
    assert set(profiles) == {"rules", "profiles"}
    for b in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
              "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-imex", "nvidia-imex-ctl"):
        assert stat.S_IMODE(os.stat(os.path.join(root, "usr/bin", b)).st_mode) == 0o755
    out = subprocess.run([os.path.join(root, "usr/bin/nvidia-persistenced"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out == "nvidia-persistenced:  version 550.54.15\n"


# --- manifest and config ---

@needs_root
def test_manifest_libraries_are_what_libnvidia_container_would_pick(node550):
    libs = node550["libraries"]
    by_arch = {(e["arch"], os.path.basename(e["path"])) for e in libs}
    assert ("x86_64", "libcuda.so.550.54.15") in by_arch and ("i386", "libcuda.so.550.54.15") in by_arch
    names = {os.path.basename(e["path"]).split(".so")[0] for e in libs}
    wanted = {n for ns in CAPABILITY_LIBRARIES.values() for n in ns}
    assert names <= wanted
    assert "libvdpau_nvidia" not in names and "libnvidia-egl-gbm" not in names and "libnvidia-gtk3" not in names
    assert all(e["path"].endswith(".550.54.15") for e in libs)
    cuda = next(e for e in libs if e["arch"] == "x86_64" and "libcuda.so" in e["path"])
    assert cuda == {"path": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "soname": "libcuda.so.1",
                    "capability": "compute", "arch": "x86_64"}
    assert len(libs) == len({(e["arch"], e["path"]) for e in libs})
    assert {e["path"] for e in libs if e["arch"] == "i386"} == {
        "/" + LIB32 + "/" + n for n in os.listdir(os.path.join(root_of(node550), LIB32))
        if n.endswith(".550.54.15")}


@needs_root
def test_manifest_describes_the_node(node550):
    m = load_manifest(root_of(node550))
    assert m == node550
    assert (m["driver_version"], m["cuda_version"], m["nvml_version"]) == ("550.54.15", "12.4", "12.550.54.15")
    g0 = m["gpus"][0]
    assert (g0["index"], g0["minor"], g0["bus_id"], g0["model"], g0["arch"], g0["brand"]) == (
        0, 0, "0000:1b:00.0", "NVIDIA H100 80GB HBM3", "9.0", "nvidia")
    assert [(d["gi"], d["ci"], d["gi_cap_minor"], d["ci_cap_minor"]) for d in g0["mig_devices"]] == [
        (1, 0, 12, 13), (2, 0, 21, 22)]
    assert m["device_majors"]["nvidia-uvm"] == 510
    assert {b["path"] for b in m["binaries"]} == {
        "/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
        "/usr/bin/nv-fabricmanager", "/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server",
        "/usr/bin/nvidia-imex", "/usr/bin/nvidia-imex-ctl"}
    assert m["ipc"][:2] == ["/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"]


@needs_root
def test_config_points_every_root_at_the_node(node550):
    root = root_of(node550)
    cfg = config.load(node550["config"], env={})
    assert (cfg.driver_root, cfg.dev_root, cfg.proc_root) == (root, root, os.path.join(root, "proc"))
    assert node550["roots"] == {"driver_root": root, "dev_root": root, "proc_root": os.path.join(root, "proc")}


@needs_root
def test_64_gpu_node(node64):
    root = root_of(node64)
    assert [g["minor"] for g in node64["gpus"]] == list(range(64))
    assert all(os.path.exists(f"{root}/dev/nvidia{n}") for n in range(64))
    assert os.path.exists(f"{root}/dev/dri/renderD191")
    assert os.path.exists(f"{root}/proc/driver/nvidia/gpus/0007:df:00.0/information")


# --- building: reuse, refusal, errors ---

@needs_root
def test_rebuilding_a_node_replaces_it(tmp_path):
    d = tmp_path / "node"
    first = build_node(d, gpus=2, mig=False)
    (d / "usr/bin/extra").write_text("left over")
    (d / "mine.txt").write_text("user file")
    second = build_node(d, gpus=1, mig=False)
    assert len(first["gpus"]) == 2 and len(second["gpus"]) == 1
    assert not (d / "usr/bin/extra").exists() and not (d / "dev/nvidia1").exists()
    assert (d / "mine.txt").read_text() == "user file"
    assert not [n for n in os.listdir(d) if n.startswith(".nvct-build-")]


@needs_root
def test_cached_node_builds_once(tmp_path):
    a = cached_node(tmp_path, gpus=1, mig=False)
    marker = os.path.join(root_of(a), "usr/bin/nvidia-smi")
    before = os.stat(marker).st_ino
    b = cached_node(tmp_path, gpus=1, mig=False)
    assert a == b and os.stat(marker).st_ino == before
    c = cached_node(tmp_path, gpus=2, mig=False)
    assert root_of(c) != root_of(a)


def test_refuses_foreign_non_empty_directory(tmp_path):
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(NvctError, match="not empty and not a simulated node"):
        build_node(tmp_path, device_nodes=False)
    assert os.listdir(tmp_path) == ["data.txt"]


def test_force_never_overwrites_existing_entries(tmp_path):
    (tmp_path / "usr").mkdir()
    with pytest.raises(NvctError, match=r"usr already exists"):
        build_node(tmp_path, device_nodes=False, force=True)
    assert os.listdir(tmp_path) == ["usr"]


def test_refuses_root_and_files(tmp_path):
    with pytest.raises(NvctError, match="refusing to build a simulated node at /"):
        build_node("/", device_nodes=False)
    (tmp_path / "f").write_text("")
    with pytest.raises(NvctError, match="exists and is not a directory"):
        build_node(tmp_path / "f", device_nodes=False)


def test_device_nodes_need_root(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NvctError) as exc:
        build_node(tmp_path / "n")
    assert str(exc.value) == "creating device nodes needs root (CAP_MKNOD)"
    assert not (tmp_path / "n").exists()


@needs_root
def test_without_device_nodes(tmp_path):
    m = build_node(tmp_path / "n", device_nodes=False, gpus=1)
    assert m["device_nodes"] == []
    assert os.listdir(tmp_path / "n" / "dev") == []
    assert m["libraries"]


def test_failed_build_leaves_directory_untouched(tmp_path):
    d = tmp_path / "n"
    with pytest.raises(NvctError, match="driver version"):
        build_node(d, driver_version="9.9", device_nodes=False)
    assert not d.exists()


def test_load_manifest_errors(tmp_path):
    with pytest.raises(NvctError, match="not a simulated node"):
        load_manifest(tmp_path)
    (tmp_path / "nvct-node.json").write_text('{"generator": "something else"}')
    with pytest.raises(NvctError, match="not a manifest written by"):
        load_manifest(tmp_path)
