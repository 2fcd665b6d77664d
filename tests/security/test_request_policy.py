"""Who may ask for which device, through real runc and crun, in every mode.

docs/security.md ("Who may request which device"): an unprivileged
container's env and annotations may name NVIDIA GPUs only; annotations are
ignored for it, like the env, when accept-nvidia-visible-devices-envvar-
when-unprivileged is false; the management devices (MIG config/monitor
capabilities) and other vendors' devices need CAP_SYS_ADMIN.
"""

from __future__ import annotations

import os

import pytest

from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import MODES, mounts_under, need_runtime, refusal, run_gpu, spec_dir

pytestmark = pytest.mark.containers

RUNTIMES = ["runc", "crun"]
LOCKED = "accept-nvidia-visible-devices-envvar-when-unprivileged = false"
ANNOTATION = {"cdi.k8s.io/nvct-test": "nvidia.com/gpu=0"}
SHOW_GPU = "ls /dev/nvidia0 2>&1; ls /dev/nvidia-caps 2>&1; echo end"


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES)
def test_annotations_are_locked_down_with_the_env(tmp_path, sim_node, rootfs, runtime, mode):
    need_runtime(runtime)
    locked = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, annotations=ANNOTATION,
                     top_config=LOCKED, command=SHOW_GPU, name="locked")
    assert locked.ok, locked.describe()
    assert "/dev/nvidia0: No such file" in locked.stdout or "can't access" in locked.stdout, locked.describe()

    privileged = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, annotations=ANNOTATION,
                         top_config=LOCKED, command=SHOW_GPU, privileged=True, name="privileged")
    assert privileged.ok, privileged.describe()
    assert privileged.stdout.splitlines()[0] == "/dev/nvidia0", privileged.describe()

    # The default (accept = true) keeps the reference's behaviour: the device plugin's channel.
    default = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, annotations=ANNOTATION,
                      command=SHOW_GPU, name="default")
    assert default.ok, default.describe()
    assert default.stdout.splitlines()[0] == "/dev/nvidia0", default.describe()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES + ("auto",))
@pytest.mark.parametrize("how", ["env", "annotation"])
def test_management_devices_need_privileges(tmp_path, sim_node, rootfs, runtime, mode, how):
    need_runtime(runtime)
    name = "management.nvidia.com/gpu=all"
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=SHOW_GPU,
                     env=[f"NVIDIA_VISIBLE_DEVICES={name}"] if how == "env" else [],
                     annotations={"cdi.k8s.io/x": name} if how == "annotation" else None)
    assert "is for privileged containers only" in refusal(result, tmp_path), result.describe()
    assert not mounts_under(rootfs)


def test_a_privileged_container_gets_the_management_devices(tmp_path, sim_node, rootfs):
    need_runtime("runc")
    _write_management_spec(tmp_path, sim_node)
    result = run_gpu(tmp_path, sim_node, rootfs, mode="cdi", privileged=True, command=SHOW_GPU,
                     env=["NVIDIA_VISIBLE_DEVICES=management.nvidia.com/gpu=all"])
    assert result.ok, result.describe()
    assert "nvidia-cap1" in result.stdout and "nvidia-cap2" in result.stdout, result.describe()


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("mode", MODES + ("auto",))
@pytest.mark.parametrize("how", ["env", "annotation"])
def test_another_vendors_device_needs_privileges(tmp_path, sim_node, rootfs, runtime, mode, how):
    need_runtime(runtime)
    host_dir = tmp_path / "host-secrets"
    host_dir.mkdir()
    (host_dir / "secret").write_text("host only\n")
    _write_vendor_spec(tmp_path, sim_node, host_dir)
    name = "acme.com/dir=host"
    command = "cat /host/secret 2>&1; echo end"
    result = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=command,
                     env=[f"NVIDIA_VISIBLE_DEVICES={name}"] if how == "env" else [],
                     annotations={"cdi.k8s.io/x": name} if how == "annotation" else None)
    assert "host only" not in result.stdout
    assert "is not an NVIDIA device" in refusal(result, tmp_path), result.describe()
    assert not mounts_under(rootfs)

    if mode == "cdi":  # a privileged container may (it could mount the directory anyway)
        allowed = run_gpu(tmp_path, sim_node, rootfs, mode=mode, runtime=runtime, command=command,
                          env=[f"NVIDIA_VISIBLE_DEVICES={name}"], privileged=True, name="privileged")
        assert allowed.ok and "host only" in allowed.stdout, allowed.describe()


def _write_vendor_spec(tmp_path, node, host_dir) -> None:
    directory = spec_dir(tmp_path, node)
    with open(os.path.join(directory, "acme.json"), "w") as f:
        f.write('{"cdiVersion": "0.5.0", "kind": "acme.com/dir", "devices": [{"name": "host", '
                '"containerEdits": {"mounts": [{"hostPath": "%s", "containerPath": "/host", '
                '"options": ["rbind", "ro"]}]}}]}' % host_dir)


def _write_management_spec(tmp_path, node) -> None:
    import subprocess

    from tests.support.gpu_runs import NVCT

    directory = spec_dir(tmp_path, node)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    proc = subprocess.run([NVCT, "cdi", "generate", "--mode", "management", "--vendor",
                           "management.nvidia.com", "--hook-path", NVCT, "--output",
                           os.path.join(directory, "management.yaml")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
