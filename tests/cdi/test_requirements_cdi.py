"""``NVIDIA_REQUIRE_*`` on every CDI path: generated specs' check-requirements step, cdi-mode shim.

Native CDI consumers (podman here) never run the shim: the first step of the
generated spec's hook chain refuses an image the node cannot satisfy, in the
process the chain runs anyway. The same step under runc and crun directly (as
containerd applies a spec), and the shim's own check in cdi mode under both.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from nvct.edits.build import chain_steps
from nvct.edits.model import HOOK_ENV
from tests.support.bundle import add_hook, edit_config, make_bundle
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED
from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor
from tests.support.runtimes import run_container

from . import e2e

UNSATISFIABLE = "NVIDIA_REQUIRE_CUDA=cuda>=99.0"
PATH_ENV = "PATH=/usr/bin:/bin:/usr/sbin:/sbin"


def _spec(entry_points, node, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    proc = subprocess.run([entry_points["nvct"], "cdi", "generate", "--format", "json",
                           "--nvidia-cdi-hook-path", entry_points["nvct"], *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _chain(spec: dict) -> list[str]:
    hooks = [h for h in spec["containerEdits"]["hooks"] if chain_steps(h["args"]) is not None]
    assert len(hooks) == 1, hooks
    return chain_steps(hooks[0]["args"])


def test_generated_spec_checks_requirements_first_with_the_nodes_facts(entry_points, node):
    steps = _chain(_spec(entry_points, node))
    first = steps[:steps.index("--")]
    assert first[:5] == ["check-requirements", "--driver-version", node["driver_version"],
                         "--cuda-version", node["cuda_version"]]
    assert "/dev/nvidia0::9.0::nvidia" in first


@pytest.mark.parametrize("flag", [("--disable-hook", "check-requirements"), ("--mode", "management")])
def test_the_step_can_be_left_out(entry_points, node, flag):
    assert "check-requirements" not in _chain(_spec(entry_points, node, *flag))


@pytest.fixture(scope="module")
def podman_cdi(private_podman, node, entry_points):
    vendor = unique_cdi_vendor()
    with cdi_spec(e2e.generate_spec_text(entry_points, node, vendor), directory=CDI_DIRS[1], suffix=".yaml"):
        yield private_podman, vendor


def _podman(podman_cdi, *env: str, device: str = "0", runtime: str = "crun"):
    podman, vendor = podman_cdi
    args = ["--rm", "--runtime", shutil.which(runtime) or runtime, "--device", f"{vendor}/gpu={device}"]
    for item in env:
        args += ["-e", item]
    return podman.run([*args, BUSYBOX_IMAGE_QUALIFIED, "sh", "-c", "ls /dev/nvidia0 && echo started"])


@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_podman_refuses_an_image_the_node_cannot_satisfy(podman_cdi, node, runtime):
    result = _podman(podman_cdi, UNSATISFIABLE, runtime=runtime)
    assert not result.ok, result.describe()
    assert "started" not in result.stdout
    if runtime == "crun":  # crun shows only the hook's exit code
        assert "error executing hook" in result.stderr, result.describe()
        return
    lines = [line for line in result.stderr.splitlines() if "unsatisfied condition" in line]
    assert len(lines) == 1, result.describe()
    assert "cuda>=99.0" in lines[0] and f"driver: {node['driver_version']}, CUDA {node['cuda_version']}" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("env", [
    (UNSATISFIABLE, "NVIDIA_DISABLE_REQUIRE=1"),
    ("NVIDIA_REQUIRE_CUDA=cuda>=12.0", "NVIDIA_REQUIRE_ARCH=arch>=9.0"),
])
def test_podman_runs_what_the_node_satisfies_or_what_disables_the_check(podman_cdi, env):
    result = _podman(podman_cdi, *env)
    assert result.ok and "started" in result.stdout, result.describe()


def test_podman_refuses_by_the_containers_gpu_arch(podman_cdi):
    result = _podman(podman_cdi, "NVIDIA_REQUIRE_ARCH=arch>=10.0", runtime="runc")
    assert not result.ok and "unsatisfied condition: arch>=10.0" in result.stderr, result.describe()


def _step_bundle(tmp_path, rootfs, node, entry_points, env: list[str]) -> str:
    """A bundle whose createContainer hook is the generated spec's check-requirements step, with /dev/nvidia0."""
    steps = _chain(_spec(entry_points, node))
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", "echo started"], [PATH_ENV, *env])
    add_hook(bundle, "createContainer", entry_points["nvct"],
             ["nvct", "hook", "chain", *steps[:steps.index("--")]], list(HOOK_ENV))
    with edit_config(bundle) as spec:
        spec.setdefault("linux", {}).setdefault("devices", []).append(
            {"path": "/dev/nvidia0", "type": "c", "major": node["device_majors"]["nvidia"], "minor": 0,
             "fileMode": 0o666})
    return bundle


@pytest.mark.parametrize("env, refused", [
    ([UNSATISFIABLE], "cuda>=99.0"),
    (["NVIDIA_REQUIRE_BRAND=brand=tesla"], "brand=tesla"),
    ([UNSATISFIABLE, "NVIDIA_DISABLE_REQUIRE=true"], None),
    (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla"], None),
])
def test_the_step_under_the_runtime_itself(tmp_path, rootfs, node, entry_points, oci_runtime, env, refused):
    """The hook chain as runc and crun run it from a spec (no shim): the env from config.json."""
    bundle = _step_bundle(tmp_path, rootfs, node, entry_points, env)
    result = run_container(oci_runtime, bundle, log_file=str(tmp_path / "log.json"), timeout=60)
    if refused is None:
        assert result.ok and "started" in result.stdout, result.describe()
        return
    assert not result.ok and "started" not in result.stdout, result.describe()
    if os.path.basename(oci_runtime[0]) == "runc":  # crun does not show a hook's stderr
        assert f"unsatisfied condition: {refused}" in result.stderr, result.describe()
        assert "Traceback" not in result.stderr


@pytest.fixture
def cdi_shim(tmp_path, node, entry_points, oci_runtime):
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "nvidia.yaml").write_text(e2e.generate_spec_text(entry_points, node))
    with open(node["config"]) as f:
        text = f.read()
    config = tmp_path / "config.toml"
    config.write_text(text + f'\n[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["{oci_runtime[0]}"]\n'
                      f'\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir}"]\n')
    return [entry_points["nvidia-container-runtime"]], dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=str(config))


@pytest.mark.parametrize("env, refused", [
    ([UNSATISFIABLE], "cuda>=99.0"),
    (["NVIDIA_REQUIRE_ARCH=arch>=10.0"], "arch>=10.0"),
    ([UNSATISFIABLE, "NVIDIA_DISABLE_REQUIRE=1"], None),
    (["NVIDIA_REQUIRE_CUDA=cuda>=12.0"], None),
])
def test_shim_in_cdi_mode_checks_requirements(cdi_shim, rootfs, tmp_path, env, refused):
    argv, shim_env = cdi_shim
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["sh", "-c", "ls /dev/nvidia0 && echo started"],
                         [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0", *env])
    result = run_container(argv, bundle, env=shim_env, log_file=str(tmp_path / "log.json"), timeout=60)
    if refused is None:
        assert result.ok and "started" in result.stdout, result.describe()
        return
    assert not result.ok and "started" not in result.stdout, result.describe()
    assert f"unsatisfied condition: {refused}" in result.stderr, result.describe()
    assert "Traceback" not in result.stderr
