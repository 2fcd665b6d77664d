"""Doctor's verdict against what a real container got, for every fault doctor knows.

Each case breaks one thing on a simulated node, runs doctor, and runs a GPU
container through nvct's shim and runc with the same config. Doctor fails
(exit status 1) exactly when the container did not get what it asked for; the
finding that names the fault has the expected status and cause; and where its
fix is a command, running it makes the finding go away and the container get
its GPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

import pytest
import yaml

from nvct import doctor
from tests.support.bundle import make_bundle
from tests.support.fixtures import BUSYBOX_IMAGE, BUSYBOX_IMAGE_QUALIFIED, need_binaries
from tests.support.gpu_runs import PATH_ENV, SHIM, VENV_BIN, need_runtime
from tests.support.proc import wait_until
from tests.support.runtimes import run_container

from .nodes import GpuNode, by_id, write

pytestmark = pytest.mark.containers

LIB = "usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
GPU = 3


@dataclass(frozen=True)
class Fault:
    finding: str
    status: str
    seen: str
    gets_gpu: bool
    apply: Callable[[GpuNode], None]
    modes: tuple = ("jit-cdi",)
    #: None: run the fix as printed; a callable: the command in it; a string: why it cannot run here.
    fix: Callable[[str], str] | str | None = None
    command: str = "nvidia-smi -L"
    #: a change to the container's image (its rootfs)
    image: Callable[[str], None] | None = None
    #: doctor --deep (NVML asked about each GPU)
    deep: bool = False


def _config(node: GpuNode, old: str, new: str) -> None:
    with open(node.config) as f:
        text = f.read()
    assert old in text, (old, text)
    write(node.config, text.replace(old, new, 1))


def _runtime_key(node: GpuNode, line: str) -> None:
    _config(node, "[nvidia-container-runtime]\n", f"[nvidia-container-runtime]\n{line}\n")


def _remove_all_nodes(node: GpuNode) -> None:
    for entry in os.listdir(node.path("dev")):
        if entry.startswith("nvidia"):
            path = node.path(f"dev/{entry}")
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _wrong_numbers(node: GpuNode) -> None:
    os.unlink(node.path(f"dev/nvidia{GPU}"))
    os.mknod(node.path(f"dev/nvidia{GPU}"), 0o20666, os.makedev(195, 5))


def _libcuda_of_another_driver(node: GpuNode) -> None:
    shutil.copy(node.path(f"{LIB}/libcuda.so.{VERSION}"), node.path(f"{LIB}/libcuda.so.535.161.08"))
    os.unlink(node.path(f"{LIB}/libcuda.so.1"))
    os.symlink("libcuda.so.535.161.08", node.path(f"{LIB}/libcuda.so.1"))
    node.regenerate_ldcache()


def _uncache(node: GpuNode, prefix: str) -> None:
    """Files of ``prefix`` on disk, but not in the ld cache (ldconfig not run after installing them)."""
    saved = node.path("saved")
    os.makedirs(saved)
    names = [n for n in os.listdir(node.path(LIB)) if n.startswith(prefix)]
    for name in names:
        os.rename(node.path(f"{LIB}/{name}"), os.path.join(saved, name))
    node.regenerate_ldcache()
    for name in names:
        os.rename(os.path.join(saved, name), node.path(f"{LIB}/{name}"))


def _module_version(node: GpuNode) -> None:
    write(node.path("proc/driver/nvidia/version"),
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 00:00:00 UTC 2024\n")


def _no_uvm(node: GpuNode) -> None:
    with open(node.path("proc/devices")) as f:
        text = f.read()
    write(node.path("proc/devices"), text.replace("510 nvidia-uvm\n", ""))


def _spec(node: GpuNode) -> str:
    return os.path.join(node.cdi_dir, "nvidia.yaml")


def _edit_spec(node: GpuNode, change) -> None:
    with open(_spec(node)) as f:
        raw = yaml.safe_load(f)
    change(raw)
    write(_spec(node), yaml.safe_dump(raw))


def _spec_of_another_root(node: GpuNode) -> None:
    """A copy of the driver elsewhere (a driver container's root, say), and the spec made for it."""
    from nvct.discover.driver import Driver

    other = os.path.join(node.tmp, "other-root")
    subprocess.run(["cp", "-a", node.dir, other], check=True)
    node.write_cdi_spec(driver=Driver(other, other, os.path.join(other, "proc")))


def _mount_gone(raw) -> None:
    mount = next(m for m in raw["containerEdits"]["mounts"] if "libnvidia-ml.so" in m["hostPath"])
    mount["hostPath"] += ".gone"


def _hooks_without_env(raw) -> None:
    for hook in raw["containerEdits"].get("hooks") or ():
        hook.pop("env", None)


def _writable_dir(node: GpuNode):
    shared = os.path.join(node.tmp, "shared")
    os.makedirs(shared)

    def change(raw):
        raw["containerEdits"]["mounts"].append({"hostPath": shared, "containerPath": "/shared",
                                                "options": ["rbind", "rw"]})
    return change


def _newer_compat_libcuda(rootfs: str) -> None:
    compat = os.path.join(rootfs, "usr/local/cuda/compat")
    os.makedirs(compat)
    shutil.copy(os.path.join(rootfs, "lib/x86_64-linux-gnu/libc.so.6"), os.path.join(compat, "libcuda.so.999.1.1"))


def _after_or(fix: str) -> str:
    """``apt-get install runc (or: CMD)`` -> CMD."""
    return fix.split("(or: ", 1)[1].rstrip(")")


def _generate(fix: str) -> str:
    """``regenerate it (nvct cdi generate --output F), or ...`` -> the generate command."""
    return re.search(r"\((nvct cdi generate [^)]*)\)", fix).group(1)


def _ldconfig_script(node: GpuNode) -> None:
    """Ubuntu's /sbin/ldconfig, a shell wrapper, configured with no ldconfig.real beside it."""
    wrapper = os.path.join(str(node.dir), "ldconfig-wrapper")
    write(wrapper, '#!/bin/sh\nexec /sbin/ldconfig "$@"\n')
    os.chmod(wrapper, 0o755)
    _config(node, "[nvidia-container-cli]\n", f'[nvidia-container-cli]\nldconfig = "@{wrapper}"\n')


def _old_runc(node: GpuNode) -> None:
    """runc as a release before 1.1.14 says it is (whatever the host's is)."""
    path = os.path.join(node.tmp, "old", "runc")
    write(path, '#!/bin/sh\n[ "$1" = --version ] && { echo "runc version 1.1.5"; exit 0; }\nexec /usr/sbin/runc "$@"\n')
    os.chmod(path, 0o755)
    _config(node, '"/usr/sbin/runc"', f'"{path}"')


def _default_topology(change) -> dict:
    """The default topology (DGX H100) after ``change(raw)``."""
    from nvct.simulate import topology

    raw, _ = topology.load(None)
    change(raw)
    return raw


def _gpu_entry(raw: dict, minor: int) -> dict:
    return next(g for g in raw["gpus"] if g["minor"] == minor)


def _persistence_off(node: GpuNode) -> None:
    """GPU 3 with persistence mode off (nvidia-persistenced not running for it, say)."""
    node.rebuild(topology=_default_topology(lambda raw: _gpu_entry(raw, GPU).update(persistence_mode=False)))


def _before_note(fix: str) -> str:
    """``CMD (a note)`` -> CMD."""
    return fix.split(" (", 1)[0]


FAULTS = {
    # Device nodes: runc and crun make a container's nodes from their numbers, so the host's are not needed.
    "host-gpu-node-deleted": Fault("devices.nodes", "warn", "Containers still get them", True,
                                   lambda n: os.unlink(n.path(f"dev/nvidia{GPU}")),
                                   modes=("jit-cdi", "legacy", "cdi")),
    "every-host-node-deleted": Fault("devices.nodes", "warn", "do not see the driver (no /dev/nvidiactl)", True,
                                     _remove_all_nodes, modes=("jit-cdi", "legacy")),
    "host-node-wrong-numbers": Fault("devices.nodes", "warn", "Containers still get c 195:3", True, _wrong_numbers),
    # --deep: this host's NVML opens GPUs through their host nodes (the simulated one sees a GPU whose node exists).
    "host-gpu-node-deleted-nvml": Fault("driver.nvml-devices", "warn", "(/dev/nvidia3) are missing or wrong", True,
                                        lambda n: os.unlink(n.path(f"dev/nvidia{GPU}")), deep=True,
                                        fix="'see devices.nodes': its mknod is run in host-gpu-node-deleted"),
    "host-gpu-node-deleted-persistence": Fault("devices.persistence", "ok", "unknown for GPU(s) 3", True,
                                               lambda n: os.unlink(n.path(f"dev/nvidia{GPU}")), deep=True,
                                               fix="nothing to fix: the other GPUs' mode is on"),
    # Off: the GPU initializes at each open (slower starts); containers still get it.
    "persistence-off": Fault("devices.persistence", "warn", "persistence mode is off on GPU(s) 3", True,
                             _persistence_off, deep=True,
                             fix="needs nvidia-persistenced or nvidia-smi -pm 1 on a real driver"),
    "node-closed-to-others": Fault("devices.modes", "warn", "non-root container users cannot open it", True,
                                   lambda n: os.chmod(n.path(f"dev/nvidia{GPU}"), 0o660), fix=_before_note),
    "dev-char-link-missing": Fault("devices.char-links", "warn", "systemctl daemon-reload", True,
                                   lambda n: os.unlink(n.path(f"dev/char/195:{GPU}"))),
    "no-uvm-major": Fault("devices.majors", "warn", "lists no nvidia-uvm", True, _no_uvm,
                          fix="needs the nvidia-uvm kernel module"),
    # The root setting: the container starts, without the driver.
    "driver-root-slash": Fault("config.roots", "fail", "the driver root / (nvidia-container-cli.root) holds no "
                               "driver 550.54.15 libraries", False,
                               lambda n: _config(n, f'root = "{n.dir}"', 'root = "/"'), modes=("jit-cdi", "legacy")),
    # Libraries.
    "libcuda-of-another-driver": Fault("libraries.compute", "fail", "of driver 535.161.08, but the kernel module is "
                                       "550.54.15: containers do not get it", False, _libcuda_of_another_driver,
                                       command="dlopen-probe libcuda.so.1 && nvidia-smi -L"),
    "nvml-not-in-cache": Fault("libraries.nvml", "fail", "exists but the cache was not rebuilt", False,
                               lambda n: _uncache(n, "libnvidia-ml.so")),
    "graphics-library-not-in-cache": Fault("libraries.uncached", "warn", "libnvidia-glcore.so.550.54.15", True,
                                           lambda n: _uncache(n, "libnvidia-glcore.so")),
    "module-of-another-version": Fault("libraries.versions", "fail", "the driver was changed without reloading",
                                       False, _module_version, fix="needs a reboot"),
    "module-not-loaded": Fault("driver.module", "fail", "the NVIDIA kernel module is not loaded", False,
                               lambda n: shutil.rmtree(n.path("proc/driver/nvidia")), fix="needs modprobe"),
    "ld-cache-corrupt": Fault("libraries.ldcache", "fail", "", False,
                              lambda n: write(n.path("etc/ld.so.cache"), "not a cache\n")),
    "no-gpu-in-procfs": Fault("driver.gpus", "fail", "no GPU in", False,
                              lambda n: shutil.rmtree(n.path("proc/driver/nvidia/gpus")),
                              fix="needs the GPUs back on the bus"),
    "driver-version-unreadable": Fault("driver.version", "fail", "", False,
                                       lambda n: write(n.path("proc/driver/nvidia/version"), "garbage\n"),
                                       fix="needs the module reloaded"),
    "no-cgroup-mounts": Fault("cgroup.version", "warn", "no cgroup", True,
                              lambda n: write(n.path("proc/1/mountinfo"), ""), modes=("jit-cdi", "legacy"),
                              fix="needs cgroups mounted on the host"),
    # nvct's config.
    "config-does-not-parse": Fault("config.file", "fail", "line", False,
                                   lambda n: _runtime_key(n, "mode = ["), fix="an edit of the file"),
    "config-key-typo": Fault("config.keys", "warn", "'nvidia-container-runtime.mod'", True,
                             lambda n: _runtime_key(n, 'mod = "legacy"'), fix="an edit of the file"),
    "runc-open-to-cve-2024-45310": Fault("config.runtime-cve", "warn", "is runc 1.1.5, open to CVE-2024-45310", True,
                                         _old_runc, fix=lambda fix: fix.split("or use crun: ", 1)[1]),
    "no-low-level-runtime": Fault("config.runtimes", "fail", "/nonexistent/runc", False,
                                  lambda n: _config(n, '"/usr/sbin/runc"', '"/nonexistent/runc"'), fix=_after_or),
    # A newer CUDA compat libcuda in the image: the shim leaves the chain to the hook
    # (nvct.modifier.prepare), which is gone.
    "hook-program-missing": Fault("config.hook", "fail", "fail to start at their createContainer hook", False,
                                  lambda n: _config(n, f'path = "{n.program("nvct")}"', 'path = "/nonexistent/nvct"'),
                                  fix="an edit of the file", image=lambda root: _newer_compat_libcuda(root)),
    "legacy-hook-program-missing": Fault("config.hook", "fail", "fail to start at their prestart hook", False,
                                         lambda n: _config(n, f'path = "{n.program("nvidia-container-runtime-hook")}"',
                                                           'path = "/nonexistent/hook"'),
                                         modes=("legacy",), fix="an edit of the file"),
    "ldconfig-is-a-script": Fault("config.ldconfig", "fail", "not an ELF executable (a wrapper script?", False,
                                  _ldconfig_script, modes=("jit-cdi", "legacy")),
    "log-directory-missing": Fault("config.log", "warn", "does not exist (nothing is logged)", True,
                                   lambda n: _runtime_key(n, 'debug = "/nonexistent-nvct-dir/nvct.log"'),
                                   fix="would create a directory outside the test's tmp dir"),
    # CDI.
    "cdi-spec-of-another-root": Fault("cdi.fresh", "warn", "was generated for driver root", True,
                                      _spec_of_another_root, modes=("cdi",), fix=_before_note),
    "cdi-mode-without-spec": Fault("cdi.specs", "fail", "but the shim is in cdi mode", False,
                                   lambda n: os.unlink(_spec(n)), modes=("cdi",)),
    "cdi-host-path-gone": Fault("cdi.fresh", "fail", "host path(s) do not exist", False,
                                lambda n: _edit_spec(n, _mount_gone), modes=("cdi",)),
    "cdi-hook-without-env": Fault("cdi.hook-env", "warn", "without env", True,
                                  lambda n: _edit_spec(n, _hooks_without_env), modes=("cdi",), fix=_generate),
    "cdi-writable-directory": Fault("cdi.writable-mounts", "warn", "read-write", True,
                                    lambda n: _edit_spec(n, _writable_dir(n)), modes=("cdi",), fix=_before_note),
}

CASES = [(name, mode) for name, fault in FAULTS.items() for mode in fault.modes]


@pytest.mark.parametrize("name,mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_doctor_says_what_a_real_container_got(tmp_path, rootfs, name, mode):
    need_runtime("runc")
    fault = FAULTS[name]
    node = GpuNode(tmp_path, mode=mode, real=True)
    if fault.image:
        fault.image(rootfs)
    assert _gets_gpu(node, rootfs, mode, fault.command, "before"), "the healthy node must give GPU 3"
    fault.apply(node)

    findings = node.doctor(deep=fault.deep)
    got = _gets_gpu(node, rootfs, mode, fault.command, "broken")
    report = doctor.render_text(findings)
    assert got == fault.gets_gpu, report
    # Doctor fails exactly when the container did not get its GPU.
    assert doctor.exit_code(findings) == (0 if got else 1), report
    named = [f for f in by_id(findings, fault.finding) if f.status == fault.status]
    assert named and fault.seen in named[0].seen, report
    if got:
        assert "containers get no GPU" not in report and "fail to start" not in report, report

    if isinstance(fault.fix, str):
        return  # not runnable here: fault.fix says why
    command = fault.fix(named[0].fix) if fault.fix else named[0].fix
    proc = subprocess.run(["sh", "-ec", command], capture_output=True, text=True, timeout=120,
                          env=_env(node, PATH=f"{VENV_BIN}:{os.environ['PATH']}"))
    assert proc.returncode == 0, (command, proc.stderr)
    after = node.doctor(deep=fault.deep)
    assert [f for f in by_id(after, fault.finding) if f.status in ("warn", "fail")] == [], doctor.render_text(after)
    assert _gets_gpu(node, rootfs, mode, fault.command, "fixed"), doctor.render_text(after)


def test_a_deleted_host_node_hides_the_gpu_from_the_host_only(tmp_path, rootfs):
    """What a missing host node really breaks: the host's NVML (the simulated one sees the GPUs whose
    node exists, like a real driver without nvidia-modprobe), not the container."""
    need_runtime("runc")
    node = GpuNode(tmp_path, real=True)
    os.unlink(node.path(f"dev/nvidia{GPU}"))
    env = {"LD_LIBRARY_PATH": node.path(LIB), "PATH": "/usr/bin:/bin"}
    host = subprocess.run([node.path("usr/bin/nvidia-smi"), "-L"], capture_output=True, text=True, env=env)
    assert [line.startswith("GPU ") for line in host.stdout.splitlines()].count(True) == 7
    assert node.manifest["gpus"][GPU]["uuid"] not in host.stdout
    assert _gets_gpu(node, rootfs, "jit-cdi", "nvidia-smi -L", "ctr")


def test_without_the_hook_program_gpu_containers_fail_at_their_hook_as_doctor_says(tmp_path, rootfs):
    """config.hook fails: even a container nvct.modifier.prepare does itself runs the hook for the params mask."""
    need_runtime("runc")
    node = GpuNode(tmp_path, mode="jit-cdi", real=True)
    _config(node, f'path = "{node.program("nvct")}"', 'path = "/nonexistent/nvct"')
    hook = by_id(node.doctor(), "config.hook")[0]
    assert hook.status == "fail" and "fail to start at their createContainer hook" in hook.seen
    assert not _gets_gpu(node, rootfs, "jit-cdi", "nvidia-smi -L", "prepared")


def test_a_spec_of_another_root_breaks_when_that_root_goes(tmp_path, rootfs):
    """The spec works while the other root is there, and fails once it goes: doctor then fails too."""
    need_runtime("runc")
    node = GpuNode(tmp_path, mode="cdi", real=True)
    _spec_of_another_root(node)
    assert _gets_gpu(node, rootfs, "cdi", "nvidia-smi -L", "there")
    shutil.rmtree(os.path.join(node.tmp, "other-root"))
    findings = node.doctor()
    assert not _gets_gpu(node, rootfs, "cdi", "nvidia-smi -L", "gone")
    assert doctor.exit_code(findings) == 1
    assert any(f.status == "fail" and "do not exist" in f.seen for f in by_id(findings, "cdi.fresh"))


def _gets_mig(node: GpuNode, rootfs: str, uuid: str, name: str) -> bool:
    """Whether a container asking the shim (cdi mode) for MIG device ``uuid`` sees it."""
    bundle = make_bundle(os.path.join(node.tmp, f"bundle-{name}"), rootfs, ["nvidia-smi", "-L"],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={uuid}"])
    result = run_container([SHIM], bundle, env=_env(node, PATH=os.environ.get("PATH", "/usr/bin:/bin")))
    return result.rc == 0 and f"UUID: {uuid}" in result.stdout


def test_a_spec_naming_replaced_mig_devices_fails_deep_and_in_the_container(tmp_path, rootfs):
    """cdi.fresh --deep: after the spec was generated, GPU 0's MIG devices were made again (other GPU
    instances, new UUIDs). A container asking for the spec's old MIG name gets no MIG device; doctor
    --deep fails naming it, and its fix (regenerate) gives containers the new ones."""
    need_runtime("runc")
    node = GpuNode(tmp_path, mode="cdi", real=True)
    stale = node.manifest["gpus"][0]["mig_devices"][0]["uuid"]
    assert _gets_mig(node, rootfs, stale, "before")
    node.rebuild(topology=_default_topology(lambda raw: _gpu_entry(raw, 0)["mig"].update(
        instances=["1g.10gb", "1g.10gb"])))
    new = node.manifest["gpus"][0]["mig_devices"][0]["uuid"]
    assert new != stale

    findings = node.doctor(deep=True)
    report = doctor.render_text(findings)
    assert not _gets_mig(node, rootfs, stale, "stale")
    assert doctor.exit_code(findings) == 1, report
    failed = [f for f in by_id(findings, "cdi.fresh") if f.status == "fail"]
    assert len(failed) == 1 and stale.lower() in failed[0].seen.lower(), report
    assert "start without a MIG device" in failed[0].seen, report
    proc = subprocess.run(["sh", "-ec", failed[0].fix], capture_output=True, text=True, timeout=120,
                          env=_env(node, PATH=f"{VENV_BIN}:{os.environ['PATH']}"))
    assert proc.returncode == 0, (failed[0].fix, proc.stderr)
    after = node.doctor(deep=True)
    assert [f for f in by_id(after, "cdi.fresh") if f.status in ("warn", "fail")] == [], doctor.render_text(after)
    assert _gets_mig(node, rootfs, new, "fixed")


def _env(node: GpuNode, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node.config
    env.update(extra)
    return env


def _gets_gpu(node: GpuNode, rootfs: str, mode: str, command: str, name: str) -> bool:
    """Whether a container asking for GPU 3 sees it (its UUID in nvidia-smi -L, exit 0)."""
    request = f"nvidia.com/gpu={GPU}" if mode == "cdi" else str(GPU)
    bundle = make_bundle(os.path.join(node.tmp, f"bundle-{name}"), rootfs, ["sh", "-c", command],
                         env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={request}"])
    result = run_container([SHIM], bundle, env=_env(node, PATH=os.environ.get("PATH", "/usr/bin:/bin")))
    return result.rc == 0 and f"UUID: {node.manifest['gpus'][GPU]['uuid']}" in result.stdout


def test_a_docker_runtime_that_is_gone_fails_in_doctor_and_in_docker(tmp_path, busybox_image_tar):
    """runtime.docker against a real dockerd: its nvidia runtime names a missing program, so
    docker run --runtime=nvidia fails; the fix as printed (configure, then SIGHUP) makes it work."""
    need_runtime("runc")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker")
    from tests.support.docker import Dockerd

    node = GpuNode(tmp_path, real=True)
    with Dockerd(runtimes={"nvidia": "/nonexistent/nvidia-container-runtime"},
                 extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": node.config}) as dockerd:
        dockerd.load(busybox_image_tar)
        options = dict(docker_config=dockerd.config_file, docker_socket=dockerd.socket,
                       docker_pidfile=dockerd.pidfile)
        findings = node.doctor(**options)
        assert not _docker_gets_gpu(dockerd, node)
        assert doctor.exit_code(findings) == 1
        docker = by_id(findings, "runtime.docker")[0]
        assert docker.status == "fail" and "GPU containers fail to start" in docker.seen, doctor.render_text(findings)

        command = docker.fix.replace("; then reload dockerd: ", " && ")
        proc = subprocess.run(["sh", "-ec", command], capture_output=True, text=True, timeout=60,
                              env=_env(node, PATH=f"{VENV_BIN}:{os.environ['PATH']}"))
        assert proc.returncode == 0, (command, proc.stderr)
        assert wait_until(lambda: _docker_runtime(dockerd) == SHIM, 20, 0.1), dockerd.log_tail()
        assert by_id(node.doctor(**options), "runtime.docker")[0].status == "ok"
        assert _docker_gets_gpu(dockerd, node)


def _docker_runtime(dockerd) -> str | None:
    info = dockerd.docker(["info", "--format", "{{json .Runtimes}}"], timeout=10)
    return (json.loads(info.stdout).get("nvidia") or {}).get("path") if info.ok else None


def _docker_gets_gpu(dockerd, node: GpuNode) -> bool:
    result = dockerd.run(["--rm", "--runtime=nvidia", "-e", f"NVIDIA_VISIBLE_DEVICES={GPU}", BUSYBOX_IMAGE,
                          "nvidia-smi", "-L"])
    return result.rc == 0 and f"UUID: {node.manifest['gpus'][GPU]['uuid']}" in result.stdout


def test_a_containerd_runtime_that_is_gone_fails_in_doctor_and_in_cri(tmp_path, busybox_image_tar, pause_image_tar):
    """runtime.containerd against a real containerd: a pod through the nvidia handler whose binary is
    missing fails, and doctor fails naming the file and the runtime."""
    need_runtime("runc")
    need_binaries("/usr/bin/containerd")
    from tests.support.containerd import K8S_NAMESPACE, Containerd
    from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED

    node = GpuNode(tmp_path, real=True)
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": node.config}
    with Containerd(runtimes={"nvidia": "/nonexistent/nvidia-container-runtime", "working": SHIM},
                    extra_env=env) as containerd:
        for tar in (busybox_image_tar, pause_image_tar):
            containerd.import_image(tar, K8S_NAMESPACE)
        findings = node.doctor(containerd_config=containerd.config_file)
        request = {"NVIDIA_VISIBLE_DEVICES": str(GPU)}
        broken = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["nvidia-smi", "-L"], runtime_handler="nvidia",
                                    env=request)
        working = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["nvidia-smi", "-L"], runtime_handler="working",
                                     env=request)
    uuid = f"UUID: {node.manifest['gpus'][GPU]['uuid']}"
    assert not (broken.rc == 0 and uuid in broken.stdout)
    assert working.rc == 0 and uuid in working.stdout, working.describe()
    bad = [f for f in by_id(findings, "runtime.containerd") if f.status == "fail"]
    assert doctor.exit_code(findings) == 1 and len(bad) == 1, doctor.render_text(findings)
    assert "runtime 'nvidia' runs /nonexistent/nvidia-container-runtime" in bad[0].seen


_EVIL_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void at_load(void) {
    FILE *f = fopen("%s", "a");
    if (f) { fprintf(f, "euid=%%d\n", (int)geteuid()); fclose(f); }
}
"""


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv],
                          capture_output=True, text=True, timeout=30)


def test_a_world_writable_toolkit_library_fails_and_really_gives_root(tmp_path, rootfs):
    """permissions.chain's fail is true: a library of a toolkit install left 0666 is replaced by a
    non-root user, and the next GPU container start runs that user's code as root. Its fix (chmod as
    printed) stops the same write."""
    need_runtime("runc")
    need_binaries("/usr/bin/setpriv", "/usr/bin/gcc", "/usr/bin/patchelf")
    import tempfile

    from tests.toolkit.installer import NVCT, node_flags

    node = GpuNode(tmp_path, real=True)
    # a toolkit whose directories other users may traverse (tmp_path's are 0700), like /usr/local/nvidia
    base = tempfile.mkdtemp(prefix="nvct-chain-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        install = os.path.join(base, "install")
        proc = subprocess.run([NVCT, "toolkit", "install", "--no-daemon", "--no-runtime-config",
                               "--toolkit-install-dir", install, "--pid-file", os.path.join(base, "pid"),
                               "--host-root", "/", *node_flags(node.manifest)],
                              capture_output=True, text=True, timeout=120, env=_env(node))
        assert proc.returncode == 0, proc.stderr
        toolkit = os.path.join(install, "toolkit")
        runtime = os.path.join(toolkit, "nvidia-container-runtime")
        libz = os.path.realpath(os.path.join(toolkit, ".runtime", "current", "lib", "libz.so.1"))
        options = dict(config_path=None, default_path=toolkit, toolkit_dirs=(toolkit,))
        with open(os.path.join(toolkit, "nvidia-container-runtime")) as f:
            assert "python" in f.read()
        marker = os.path.join(base, "ran-as")

        def chain():
            (found,) = by_id(node.doctor(**options), "permissions.chain")
            return found

        def start(name: str) -> bool:
            bundle = make_bundle(os.path.join(base, f"bundle-{name}"), rootfs, ["nvidia-smi", "-L"],
                                 env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={GPU}"])
            result = run_container([runtime], bundle, env={"PATH": os.environ["PATH"]})
            return result.rc == 0 and f"UUID: {node.manifest['gpus'][GPU]['uuid']}" in result.stdout

        assert chain().status == "ok", chain()
        assert start("healthy")

        os.chmod(libz, 0o666)
        found = chain()
        assert found.status == "fail" and libz in found.seen, found
        # the attacker: a libz.so.1 that needs the real one (renamed) and runs its constructor first
        evil = os.path.join(base, "evil")
        os.makedirs(evil)
        real = os.path.join(evil, "libzreal.so.1")
        shutil.copy(libz, real)
        subprocess.run(["patchelf", "--set-soname", "libzreal.so.1", real], check=True)
        with open(os.path.join(evil, "evil.c"), "w") as f:
            f.write(_EVIL_C % marker)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", os.path.join(evil, "libz.so.1"), os.path.join(evil, "evil.c"),
                        "-Wl,-soname,libz.so.1", real, f"-Wl,-rpath,{evil}"], check=True)
        os.chmod(evil, 0o755)
        saved = os.path.join(base, "libz.saved")
        shutil.copy(libz, saved)
        wrote = _as_nobody(["cp", os.path.join(evil, "libz.so.1"), libz])
        assert wrote.returncode == 0, wrote.stderr
        assert start("attacked")  # the container still gets its GPU: nothing shows the attack...
        with open(marker) as f:
            assert f.read().splitlines()[:1] == ["euid=0"]  # ...but the user's code ran as root

        # the fix, as printed, closes the hole: the same write is refused
        shutil.copy(saved, libz)
        os.unlink(marker)
        command = found.fix.split("; then ", 1)[0]  # "...; then find out who changed them"
        fix = subprocess.run(["sh", "-ec", command], capture_output=True, text=True, timeout=30)
        assert fix.returncode == 0, (found.fix, fix.stderr)
        refused = _as_nobody(["cp", os.path.join(evil, "libz.so.1"), libz])
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused
        assert chain().status == "ok", chain()
        assert start("fixed") and not os.path.exists(marker)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _docker_gpus(dockerd, node: GpuNode) -> tuple[bool, str]:
    result = dockerd.run(["--rm", "--gpus", f"device={GPU}", BUSYBOX_IMAGE, "nvidia-smi", "-L"])
    return result.rc == 0 and f"UUID: {node.manifest['gpus'][GPU]['uuid']}" in result.stdout, result.stderr


def test_docker_gpus_verdicts_against_a_real_dockerd(tmp_path, busybox_image_tar):
    """runtime.docker-gpus reads the PATH and environment of the dockerd that really runs: no hook on
    its PATH fails, and so does docker run --gpus; the hook linked into a PATH directory (the fix) and
    dockerd restarted, both work; an engine environment with Python's and the loader's variables is
    fine for both; a relative NVIDIA_CTK_CONFIG_FILE_PATH makes the hook refuse, in doctor and in docker."""
    need_runtime("runc")
    need_binaries("/usr/sbin/dockerd", "/usr/bin/docker")
    from nvct.doctor.runtimes import HOOK_BINARY
    from tests.support.docker import Dockerd

    node = GpuNode(tmp_path, real=True)
    bindir = os.path.join(node.tmp, "dockerd-bin")  # first on dockerd's PATH; empty: no hook
    os.makedirs(bindir)
    config = {"NVIDIA_CTK_CONFIG_FILE_PATH": node.config}

    def verdict(dockerd):
        options = dict(docker_config=dockerd.config_file, docker_socket=dockerd.socket,
                       docker_pidfile=dockerd.pidfile)
        (found,) = by_id(node.doctor(**options), "runtime.docker-gpus")
        return found

    if shutil.which(HOOK_BINARY, path="/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"):
        pytest.fail(f"{HOOK_BINARY} is installed on this host: dockerd cannot be started without it")
    with Dockerd(path_prefix=[bindir], extra_env=config) as dockerd:
        dockerd.load(busybox_image_tar)
        found = verdict(dockerd)
        got, stderr = _docker_gpus(dockerd, node)
    assert not got and "could not select device driver" in stderr, stderr
    assert found.status == "fail" and f"where there is no {HOOK_BINARY}" in found.seen, found
    # the fix: its ln -s, into the first directory of dockerd's PATH (the printed one is /usr/bin, on it too)
    link = found.fix.split(", then ", 1)[0].replace(f" /usr/bin/{HOOK_BINARY}", f" {bindir}/{HOOK_BINARY}")
    assert link.startswith("ln -s ") and link.endswith(f"{bindir}/{HOOK_BINARY}"), found.fix
    subprocess.run(["sh", "-ec", link], check=True)

    hostile = {**config, "PYTHONHOME": "/nonexistent", "PYTHONPATH": "/nonexistent", "PYTHONSAFEPATH": "",
               "LD_LIBRARY_PATH": "/nonexistent"}
    for env, works, seen in ((config, True, "docker run --gpus works"),
                             (hostile, True, "docker run --gpus works"),
                             ({"NVIDIA_CTK_CONFIG_FILE_PATH": "relative/config.toml"}, False, "refusing to run")):
        with Dockerd(path_prefix=[bindir], extra_env=env) as dockerd:  # restarted: it looks once, at start
            dockerd.load(busybox_image_tar)
            found = verdict(dockerd)
            got, stderr = _docker_gpus(dockerd, node)
        assert got == works, (env, stderr)
        assert found.status == ("ok" if works else "fail") and seen in found.seen, (env, found)


def test_ctr_gpus_verdicts_against_a_real_containerd(tmp_path, busybox_image_tar):
    """runtime.ctr-gpus reads the caller's environment, which ctr hands its hook: no nvidia-container-cli
    on PATH is info and ctr run --gpus fails; linked in (the fix), both work; a relative
    NVIDIA_CTK_CONFIG_FILE_PATH fails in doctor and in ctr."""
    need_runtime("runc")
    need_binaries("/usr/bin/containerd", "/usr/bin/ctr")
    from nvct.doctor.runtimes import CLI_BINARY
    from tests.support.containerd import Containerd

    node = GpuNode(tmp_path, real=True)
    bindir = os.path.join(node.tmp, "ctr-bin")
    os.makedirs(bindir)
    uuid = f"UUID: {node.manifest['gpus'][GPU]['uuid']}"
    with Containerd(path_prefix=[bindir], extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": node.config}) as containerd:
        containerd.import_image(busybox_image_tar)

        def case(env: dict):
            (found,) = by_id(node.doctor(env=env), "runtime.ctr-gpus")
            saved = containerd.env
            containerd.env = env
            try:
                result = containerd.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["nvidia-smi", "-L"],
                                            extra_args=["--gpus", str(GPU)])
            finally:
                containerd.env = saved
            return found, result.rc == 0 and uuid in result.stdout, result

        if shutil.which(CLI_BINARY, path=containerd.env["PATH"]):
            pytest.fail(f"{CLI_BINARY} is installed on this host")
        found, got, result = case(dict(containerd.env))
        assert not got and CLI_BINARY in result.stderr, result.describe()
        assert found.status == "info" and f"has no {CLI_BINARY}" in found.seen, found
        link = found.fix.split(": ", 1)[1].replace(f" /usr/bin/{CLI_BINARY}", f" {bindir}/{CLI_BINARY}")
        subprocess.run(["sh", "-ec", link], check=True)

        found, got, result = case(dict(containerd.env))
        assert got and found.status == "ok", (found, result.describe())
        found, got, result = case({**containerd.env, "NVIDIA_CTK_CONFIG_FILE_PATH": "relative/config.toml"})
        assert not got and "refusing to run" in result.stderr + result.stdout, result.describe()
        assert found.status == "fail" and "refusing to run" in found.seen, found


def test_a_drifted_containerd_drop_in_hides_the_main_files_edit(tmp_path, busybox_image_tar, pause_image_tar):
    """runtime.containerd-drift against a real containerd 1.6: after nvct's drop-in (with its copy of
    the CRI section), the operator makes nvidia the default runtime in config.toml; containerd keeps
    the copy's runc, so a pod without a handler gets no GPU, and doctor warns naming the setting.
    The fix as printed (configure again, restart) brings the copy up to date: the pod gets its GPU."""
    need_runtime("runc")
    need_binaries("/usr/bin/containerd")
    from tests.support.containerd import K8S_NAMESPACE
    from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED
    from tests.toolkit.test_e2e_containerd import RestartableContainerd

    node = GpuNode(tmp_path, real=True)
    state = {"NVCT_STATE_DIR": os.path.join(node.tmp, "state")}  # nvct's list of configured files: private
    uuid = f"UUID: {node.manifest['gpus'][GPU]['uuid']}"
    with RestartableContainerd(extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": node.config}) as containerd:
        for tar in (busybox_image_tar, pause_image_tar):
            containerd.import_image(tar, K8S_NAMESPACE)
        config = containerd.config_file
        env = _env(node, PATH=f"{VENV_BIN}:{os.environ['PATH']}", **state)
        subprocess.run([os.path.join(VENV_BIN, "nvidia-ctk"), "runtime", "configure", "--runtime=containerd",
                        f"--config={config}", f"--nvidia-runtime-path={SHIM}"], check=True, capture_output=True,
                       env=env)
        containerd.restart()

        def drift():
            (found,) = by_id(node.doctor(containerd_config=config), "runtime.containerd-drift")
            return found

        def default_gets_gpu() -> bool:
            result = containerd.cri_run(BUSYBOX_IMAGE_QUALIFIED, ["nvidia-smi", "-L"],
                                        env={"NVIDIA_VISIBLE_DEVICES": str(GPU)})
            return result.rc == 0 and uuid in result.stdout

        assert drift().status == "ok", drift()
        _replace(config, 'default_runtime_name = "runc"', 'default_runtime_name = "nvidia"')
        containerd.restart()
        found = drift()
        assert not default_gets_gpu()
        assert found.status == "warn" and "default_runtime_name" in found.seen and '"nvidia"' in found.seen, found

        command, _, restart = found.fix.partition("; then ")
        assert restart == "restart containerd", found.fix
        # it keeps the runtime's path and the operator's default (configure alone resets both)
        assert f"--nvidia-runtime-path {SHIM} --set-as-default" in command, found.fix
        proc = subprocess.run(["sh", "-ec", _before_note(command)], capture_output=True, text=True, timeout=60,
                              env=env)
        assert proc.returncode == 0, (command, proc.stderr)
        containerd.restart()
        assert drift().status == "ok", drift()
        assert default_gets_gpu()


def _replace(path: str, old: str, new: str) -> None:
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, text
    write(path, text.replace(old, new))


def test_a_crio_runtime_that_is_gone_fails_in_doctor_and_under_conmon(tmp_path, busybox_image_tar):
    """runtime.crio: Debian 12 has no cri-o package, so the runtime path its drop-in names is run by
    conmon (what cri-o runs it through) under podman. A missing path fails in doctor and there; after
    the fix as printed, the path the drop-in names gives the container its GPU."""
    need_runtime("runc")
    need_binaries("/usr/bin/podman", "/usr/bin/conmon")
    import tomllib

    from tests.support.podman import Podman

    node = GpuNode(tmp_path, real=True)
    crio_dir = os.path.join(node.tmp, "crio-test", "crio.conf.d")
    drop_in = os.path.join(crio_dir, "99-nvidia.toml")
    write(drop_in, '[crio.runtime.runtimes.nvidia]\nruntime_path = "/nonexistent/nvidia-container-runtime"\n'
                   'runtime_type = "oci"\n')
    uuid = f"UUID: {node.manifest['gpus'][GPU]['uuid']}"

    def crio():
        return [f for f in by_id(node.doctor(crio_dir=crio_dir), "runtime.crio")]

    def gets_gpu(podman) -> bool:
        with open(drop_in, "rb") as f:
            path = tomllib.load(f)["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_path"]
        result = podman.podman(["--runtime", path, "run", "--rm", "-e", f"NVIDIA_VISIBLE_DEVICES={GPU}",
                                BUSYBOX_IMAGE, "nvidia-smi", "-L"])
        return result.rc == 0 and uuid in result.stdout

    with Podman(runtime="/usr/sbin/runc") as podman:
        _conmon_env(podman, {"NVIDIA_CTK_CONFIG_FILE_PATH": node.config})  # as cri-o's env reaches conmon
        podman.load(busybox_image_tar)
        (found,) = crio()
        assert found.status == "fail" and "/nonexistent/nvidia-container-runtime" in found.seen, found
        assert not gets_gpu(podman)
        command, _, restart = found.fix.partition("; ")
        assert restart == "then restart cri-o", found.fix
        # The fix names no main config: nvct records its undo beside /etc/crio/crio.conf, here an
        # overlay of /etc in a mount namespace of its own, so the host's /etc stays as it was.
        etc = os.path.join(node.tmp, "etc-rw")
        private_etc = (f'mkdir -p {etc} && mount -t tmpfs nvct-etc {etc} && mkdir {etc}/up {etc}/work && '
                       f'mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/up,workdir={etc}/work /etc')
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec",
                               f"{private_etc}\n{command}"], capture_output=True, text=True, timeout=60,
                              env=_env(node, PATH=f"{VENV_BIN}:{os.environ['PATH']}",
                                       NVCT_STATE_DIR=os.path.join(node.tmp, "state")))
        assert proc.returncode == 0, (command, proc.stderr)
        assert [f.status for f in crio()] == ["ok"], crio()
        assert gets_gpu(podman)


def _conmon_env(podman, env: dict) -> None:
    """containers.conf's ``conmon_env_vars``: podman hands conmon (and so the runtime) no other variable."""
    import tomlkit

    with open(podman.containers_conf) as f:
        conf = tomlkit.parse(f.read())
    conf["engine"]["conmon_env_vars"] = [f"PATH={os.environ['PATH']}", *(f"{k}={v}" for k, v in env.items())]
    write(podman.containers_conf, tomlkit.dumps(conf))


#: Every check doctor has, and where its verdict meets a real container (a FAULTS case or a test here,
#: or a file beside this one), or why it cannot.
COVERAGE = {
    "config.check_file": ["config-does-not-parse", "config-key-typo"],  # config.file, config.keys
    "config.check_roots": ["driver-root-slash"],
    "config.check_runtimes": ["no-low-level-runtime", "runc-open-to-cve-2024-45310"],  # and config.runtime-cve
    "config.check_hook": ["hook-program-missing", "legacy-hook-program-missing",
                          "test_without_the_hook_program_gpu_containers_fail_at_their_hook_as_doctor_says"],
    "config.check_ldconfig": ["ldconfig-is-a-script"],
    "config.check_log": ["log-directory-missing"],
    "driver.check_module": ["module-not-loaded"],
    "driver.check_version": ["driver-version-unreadable"],
    "driver.check_gpus": ["no-gpu-in-procfs"],
    "driver.check_nvml": ["host-gpu-node-deleted-nvml", "module-of-another-version",
                          "test_a_deleted_host_node_hides_the_gpu_from_the_host_only"],
    "devices.check_majors": ["no-uvm-major"],
    "devices.check_nodes": ["host-gpu-node-deleted", "every-host-node-deleted", "host-node-wrong-numbers"],
    "devices.check_modes": ["node-closed-to-others"],
    "devices.check_char_links": ["dev-char-link-missing"],
    "devices.check_persistence": ["persistence-off", "host-gpu-node-deleted-persistence"],
    "libraries.check_ldcache": ["ld-cache-corrupt"],
    "libraries.check_versions": ["module-of-another-version"],
    "libraries.check_required": ["libcuda-of-another-driver", "nvml-not-in-cache"],
    "libraries.check_uncached": ["graphics-library-not-in-cache"],
    "runtimes.check_docker": ["test_a_docker_runtime_that_is_gone_fails_in_doctor_and_in_docker"],
    "runtimes.check_docker_gpus": ["test_docker_gpus_verdicts_against_a_real_dockerd"],
    "runtimes.check_containerd": ["test_a_containerd_runtime_that_is_gone_fails_in_doctor_and_in_cri",
                                  "test_a_drifted_containerd_drop_in_hides_the_main_files_edit"],
    "runtimes.check_ctr_gpus": ["test_ctr_gpus_verdicts_against_a_real_containerd"],
    # Debian has no nerdctl: tests/e2e/test_cli_gpus.py runs doctor against stand-in nerdctl programs
    "runtimes.check_nerdctl_gpus": "no nerdctl package in Debian 12",
    # Debian 12 has no cri-o package: the runtime path is run by conmon, as cri-o would
    "runtimes.check_crio": ["test_a_crio_runtime_that_is_gone_fails_in_doctor_and_under_conmon"],
    "cdi.check_specs": ["cdi-mode-without-spec"],
    "cdi.check_fresh": ["cdi-spec-of-another-root", "cdi-host-path-gone",
                        "test_a_spec_of_another_root_breaks_when_that_root_goes",
                        "test_a_spec_naming_replaced_mig_devices_fails_deep_and_in_the_container"],
    "cdi.check_hook_env": ["cdi-hook-without-env"],
    "cdi.check_writable_mounts": ["cdi-writable-directory"],
    "cgroups.check_version": ["no-cgroup-mounts"],
    "permissions.check_chain": ["test_a_world_writable_toolkit_library_fails_and_really_gives_root"],
    "standins.check_standins": ["test_standins.py"],
    "platforms.check_tegra": ["test_platforms.py"],  # a CSV-listed libcuda deleted, on an arm64 container
    "platforms.check_wsl": ["test_platforms.py"],  # /dev/dxg removed
}


def test_every_check_meets_a_real_container_or_says_why_not():
    checks = {f"{c.__module__.rsplit('.', 1)[1]}.{c.__name__}" for _, group in doctor.GROUPS for c in group}
    assert sorted(checks) == sorted(COVERAGE)
    here = globals()
    for check, cases in COVERAGE.items():
        if isinstance(cases, str):
            continue  # why not
        for case in cases:
            if case.endswith(".py"):
                assert os.path.exists(os.path.join(os.path.dirname(__file__), case)), (check, case)
            else:
                assert case in FAULTS or callable(here.get(case)), (check, case)
