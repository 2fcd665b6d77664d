"""nvct.hooks.compat: the compat note's device list against the container's GPUs.

The note's ``Device`` list holds NVML brand ids (nvmlBrandType_t): NVIDIA's
575 and 590 packages list 1, 2 and 7-14 (Quadro, Tesla, the virtual and
NVIDIA/RTX brands) and leave out GeForce, Titan and NVS, the GPUs forward
compat does not support. The GPUs come from the step (``--gpu-uuid``) or the
spec's ``/dev/nvidiaN`` nodes; their brands from the simulated node's NVML
(an H100, brand 14, and a GeForce RTX 4090, brand 15). Containers through
runc and crun: tests/e2e/test_cuda_compat.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from nvct.edits import steps as kinds
from nvct.hooks import compat
from nvct.linux import elf
from nvct.rootfs.root import Rootfs
from tests.support.compat import NOTE_575, NOTE_580, make_compat_libcuda, mixed_brands_node
from tests.support.fixtures import need_root, skip

SOURCE = "/bin/true"  # any ELF file: the decision reads only the note
HOST = "550.54.15"  # the simulated node's driver: its branch is in NOTE_575's list


@pytest.fixture(autouse=True)
def _objcopy():
    if not shutil.which("objcopy"):
        skip("needs objcopy (binutils)")
    compat._BRANDS.clear()  # each test asks NVML afresh


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    need_root()
    return mixed_brands_node(tmp_path_factory)


def _root(tmp_path, note) -> Rootfs:
    make_compat_libcuda(SOURCE, str(tmp_path / "root/usr/local/cuda/compat/libcuda.so.575.57.08"), note)
    return Rootfs(str(tmp_path / "root"))


def _step(node=None, uuids=(), driver_root: str = "") -> kinds.EnableCudaCompat:
    return kinds.EnableCudaCompat(HOST, gpu_uuids=tuple(uuids),
                                  driver_root=node["roots"]["driver_root"] if node else driver_root)


def _uuid(node, index: int) -> str:
    return node["gpus"][index]["uuid"]


def _note(devices) -> dict:
    return {**NOTE_575, "device": devices}


@pytest.mark.parametrize("devices, parsed", [
    ([1, 2, 14], [1, 2, 14]),
    ([], []),
    ("14", []),                  # not a list: no device list
    ([True, "14", 14.0, 2], [2]),  # only whole numbers count (JSON true is no brand)
])
def test_the_device_list_as_the_note_carries_it(tmp_path, devices, parsed):
    """The note's JSON read back from the section; what of ``Device`` counts as the device list."""
    lib = make_compat_libcuda(SOURCE, str(tmp_path / "libcuda.so.575.57.08"), _note(devices))
    fd = os.open(lib, os.O_RDONLY)
    try:
        note = elf.cuda_compat_note(fd, lib)
    finally:
        os.close(fd)
    assert note["device"] == devices
    root = _root(tmp_path, _note(devices))
    folder, why = compat.compat_choice(root, kinds.EnableCudaCompat(HOST, gpu_brands=("2",)))
    assert folder is not None, why
    assert ("device list" in why) is bool(parsed)


@pytest.mark.parametrize("gpus, used, named", [
    ((0,), True, None),                 # the H100: brand 14, listed
    ((1,), False, (1, "geforcertx, brand 15")),
    ((0, 1), False, (1, "geforcertx, brand 15")),  # one unlisted GPU is enough: CUDA fails with 804
])
def test_every_gpu_of_the_container_by_uuid(tmp_path, node, gpus, used, named):
    folder, why = compat.compat_choice(_root(tmp_path, NOTE_575), _step(node, [_uuid(node, i) for i in gpus]))
    assert (folder is not None) is used, why
    if named:
        assert f"does not list GPU {_uuid(node, named[0])} ({named[1]})" in why and "804" in why, why
        assert _uuid(node, 0) not in why
    else:
        assert why.endswith("the note's device list names the brand of every GPU"), why


@pytest.mark.parametrize("paths, used", [
    (["/dev/nvidia0"], True),
    (["/dev/nvidia1"], False),
    (["/dev/nvidia0", "/dev/nvidia1"], False),
])
def test_a_spec_chain_finds_the_gpus_by_their_nodes(tmp_path, node, paths, used):
    """A CDI spec's chain names no GPU: the spec's device nodes (or bind-mounted nodes) say which."""
    spec = {"linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": paths[0]}]},
            "mounts": [{"destination": p} for p in paths[1:]]}
    folder, why = compat.compat_choice(_root(tmp_path, NOTE_575), _step(node), spec)
    assert (folder is not None) is used, why
    if not used:
        assert "does not list GPU /dev/nvidia1 (geforcertx, brand 15)" in why


def test_unknown_gpus_leave_the_list_unchecked(tmp_path):
    """No GPU named and no spec: as the reference, which never checks the list (the hook, with the
    container's spec, decides where the shim cannot)."""
    folder, why = compat.compat_choice(_root(tmp_path, NOTE_575), _step())
    assert folder is not None and "the container's GPUs are unknown" in why


def test_nvml_that_cannot_answer_is_a_warning(tmp_path, capsys):
    folder, why = compat.compat_choice(_root(tmp_path, NOTE_575), _step(uuids=["GPU-x"], driver_root=str(tmp_path)))
    assert folder is not None and "not checked (no libnvidia-ml.so.1 under the driver root" in why
    assert capsys.readouterr().err.startswith("enable-cuda-compat: no libnvidia-ml.so.1")


def test_nvml_is_asked_once_per_process(tmp_path, node):
    """The shim decides, then runs the step itself: one NVML load between them."""
    step = _step(node, [_uuid(node, 1)])
    root = _root(tmp_path, NOTE_575)
    assert compat.compat_choice(root, step)[0] is None
    key = next(iter(compat._BRANDS))
    compat._BRANDS[key] = [("GPU-cached", 14)]
    assert compat.compat_choice(root, step)[0] is not None  # the cached answer, not NVML's


@pytest.mark.parametrize("note, asked", [
    ({**NOTE_575, "device": []}, False),     # no device list
    ({**NOTE_575, "driver": [570]}, False),  # excluded branch: decided before the device list
    (NOTE_575, True),
])
def test_nvml_is_loaded_only_for_a_note_with_a_device_list(tmp_path, note, asked):
    """The common path costs nothing: no NVML binding imported unless the list is what decides."""
    _root(tmp_path, note)
    code = (
        "import sys\n"
        "from nvct.edits import steps as kinds\n"
        "from nvct.hooks.compat import compat_choice\n"
        "from nvct.rootfs.root import Rootfs\n"
        f"compat_choice(Rootfs({str(tmp_path / 'root')!r}), kinds.EnableCudaCompat({HOST!r}, gpu_uuids=('GPU-x',),"
        f" driver_root={str(tmp_path)!r}))\n"
        "print('nvct.discover.nvml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(asked)


def test_jit_cdi_and_legacy_edits_carry_the_container_gpus(node):
    """The edits name the request's GPUs on the step (a MIG device by its parent), and the driver root."""
    from nvct.config import file as config_mod
    from nvct.discover.driver import Driver
    from nvct.edits import build
    from nvct.edits.model import as_chain
    from nvct.request.container import from_env

    config = config_mod.load(node["config"], env={})
    driver = Driver.from_config(config)
    request = from_env({"NVIDIA_VISIBLE_DEVICES": "1,0", "NVIDIA_DRIVER_CAPABILITIES": "compute"}, config)
    edits = build.container_edits(request, driver, config)
    step = next(s for h in edits.hooks if (c := as_chain(h)) for s in c.steps if isinstance(s, kinds.EnableCudaCompat))
    assert set(step.gpu_uuids) == {_uuid(node, 0), _uuid(node, 1)}
    assert step.driver_root == node["roots"]["driver_root"]


@pytest.mark.parametrize("mode", ["legacy", "jit-cdi", "cdi"])
def test_explain_names_the_gpu_the_list_leaves_out(node, tmp_path, mode):
    """``nvct explain --bundle``: which GPU of the container the note's device list does not name."""
    from nvct.config import file as config_mod
    from nvct.doctor import explain, explainview
    from nvct.oci import spec as ocispec
    from tests.support.bundle import make_bundle
    from tests.support.gpu_runs import spec_dir
    from tests.support.rootfs import make_rootfs

    rootfs = make_rootfs(str(tmp_path))
    make_compat_libcuda(SOURCE, os.path.join(rootfs, "usr/local/cuda/compat/libcuda.so.575.57.08"), NOTE_575)
    request = "nvidia.com/gpu=0,nvidia.com/gpu=1" if mode == "cdi" else "0,1"
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES={request}"])
    config = config_mod.load(node["config"], env={})
    config.data["nvidia-container-runtime"]["mode"] = mode
    if mode == "cdi":
        config.data["nvidia-container-runtime"].setdefault("modes", {})["cdi"] = {
            "spec-dirs": [spec_dir(tmp_path, node)]}
    result = explain.explain(ocispec.load(str(bundle)), config, bundle=str(bundle))
    assert result.error is None, result.error
    gpu = "/dev/nvidia1" if mode == "cdi" else _uuid(node, 1)
    assert result.compat.startswith("not used: /usr/local/cuda/compat/libcuda.so.575.57.08: its CUDA compat "
                                    "note's device list (1, 2, 7, 8, 9, 10, 11, 12, 13, 14) does not list "
                                    f"GPU {gpu} (geforcertx, brand 15)"), result.compat
    assert f"cuda compat: {result.compat}" in explainview.render_text(result)


def test_a_hostile_device_list_is_bounded_in_the_reason(tmp_path):
    """The image writes the note: its list shows in the reason (explain, the hook's log) cut short."""
    folder, why = compat.compat_choice(_root(tmp_path, _note(list(range(100, 5100)))),
                                       kinds.EnableCudaCompat(HOST, gpu_brands=("5",)))
    assert folder is None and "(100, 101," in why and ", ...) does not list the GPU brand 5 " in why
    assert len(why) < 400


@pytest.mark.parametrize("note", [
    NOTE_580,                                                   # the keys as the packages write them
    {"Format": 1, "CUDA Version": "13.0", "Driver": NOTE_580["driver"], "Device": NOTE_580["device"]},
    {"FORMAT": 1, "cuda VERSION": "13.0", "DRIVER": NOTE_580["driver"], "DEVICE": NOTE_580["device"]},
])
def test_the_note_fields_in_any_case(tmp_path, note):
    """The reference decodes the note's JSON case-blind (Go): CUDA 13.0's 580.95.05 writes ``driver``,
    ``device`` and ``CUDA version``, which an exact match missed (compat was never used)."""
    root = _root(tmp_path, note)
    assert compat.compat_choice(root, kinds.EnableCudaCompat("570.1.1", gpu_brands=("14",)))[0] is not None
    assert compat.compat_choice(root, kinds.EnableCudaCompat("560.1.1"))[0] is None  # 560 not listed
    folder, why = compat.compat_choice(root, kinds.EnableCudaCompat("570.1.1", gpu_brands=("5",)))
    assert folder is None and "does not list the GPU brand 5" in why
    assert compat.compat_choice(root, kinds.EnableCudaCompat(host_cuda_version="12.8"))[0] is not None
