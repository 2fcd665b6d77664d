"""The nvidia-cdi-refresh units the packages ship: systemd accepts them, and what they run works.

Here the units are checked with ``systemd-analyze verify`` and their commands are run
as the service would run them (tests/e2e/test_refresh_units.py runs them under a real systemd): the ExecCondition's
grep on module lists with and without an NVIDIA module, and ExecStart
(``nvidia-ctk cdi generate`` with the unit's environment, the output path
overridden as the unit's EnvironmentFile allows) on the simulated node.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import yaml

from tests.e2e.conftest import VENV_BIN
from tests.packaging.pkgtest import REPO
from tests.support.fixtures import skip

UNITS = REPO / "packaging" / "systemd"
SERVICE = UNITS / "nvidia-cdi-refresh.service"


def _directives(path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _generate_line(directives) -> str:
    """The service's ExecStart that generates the spec (others may come before it)."""
    (line,) = [line for line in directives["ExecStart"] if " cdi generate" in line]
    return line


def test_systemd_accepts_the_units(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        skip("needs systemd-analyze (package systemd)")
    for unit in UNITS.iterdir():
        if unit.is_file():  # drop-in directories are read beside their unit, not verified alone
            shutil.copy(unit, tmp_path)
    proc = subprocess.run([analyze, "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
                          capture_output=True, text=True, check=False)
    problems = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                if not (ln.endswith("Command /usr/bin/nvidia-ctk is not executable: No such file or directory")
                        and not os.path.exists("/usr/bin/nvidia-ctk"))]
    assert problems == [], problems


def test_the_condition_matches_exactly_kernels_with_an_nvidia_module(tmp_path):
    (condition,) = _directives(SERVICE)["ExecCondition"]
    argv = [a.replace("\\\\", "\\") for a in shlex.split(condition)]  # systemd's unescaping
    assert argv[:2] == ["/usr/bin/grep", "-qE"] and argv[3] == "/lib/modules/%v/modules.dep"
    for text, found in (("kernel/drivers/video/nvidia.ko:\n", True),
                        ("updates/dkms/nvidia-current.ko.xz: kernel/drivers/i2c.ko\n", True),
                        ("kernel/drivers/gpu/nouveau.ko:\nkernel/nvidia-uvm-helper.ko:\n", False)):
        modules_dep = tmp_path / "modules.dep"
        modules_dep.write_text(text)
        assert subprocess.run([*argv[:3], str(modules_dep)], check=False).returncode == (0 if found else 1), text


def test_the_units_refresh_every_time_and_before_the_engines():
    """What issue 25 found wrong (after multi-user.target; RemainAfterExit keeping the path unit
    from starting it again) stays fixed; run under a real systemd in tests/e2e/test_refresh_units.py."""
    service = _directives(SERVICE)
    assert "RemainAfterExit" not in service and "After" not in service
    assert service["Restart"] == ["on-failure"] and service["StartLimitBurst"] == ["5"]
    assert service["ExecStart"][0] == ("-/usr/bin/nvidia-ctk system create-device-nodes --control-devices "
                                       "--load-kernel-modules")
    engines = _directives(UNITS / "nvidia-cdi-refresh.service.d" / "10-container-engines.conf")
    (before,) = engines["Before"]
    assert {"docker.service", "containerd.service", "crio.service"} <= set(before.split())
    watched = _directives(UNITS / "nvidia-cdi-refresh.path")["PathChanged"]
    assert "/lib/modules/%v/modules.dep" in watched and "/dev/nvidia-caps" in watched
    rule = (REPO / "packaging" / "udev" / "99-nvidia-cdi-refresh.rules").read_text()
    (line,) = [ln for ln in rule.splitlines() if ln and not ln.startswith("#")]
    assert {'ACTION=="add"', 'SUBSYSTEM=="module"', 'KERNEL=="nvidia|nvidia_current"',
            'ENV{SYSTEMD_WANTS}+="nvidia-cdi-refresh.service"'} <= set(line.split(", "))


def test_the_service_writes_the_nodes_spec(sim_node, tmp_path):
    directives = _directives(SERVICE)
    start = _generate_line(directives)
    assert start == "/usr/bin/nvidia-ctk cdi generate"
    env = dict(e.split("=", 1) for e in directives["Environment"])
    assert env == {"NVIDIA_CTK_CDI_OUTPUT_FILE_PATH": "/var/run/cdi/nvidia.yaml"}
    assert directives["EnvironmentFile"] == ["-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"]
    output = tmp_path / "nvidia.yaml"  # what the env file may set; /var/run/cdi is the host's
    env.update(NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=str(output), PATH="/usr/bin:/bin",
               NVIDIA_CTK_CONFIG_FILE_PATH=sim_node["config"])
    spec = _run_start(start, env, output)
    assert spec["kind"] == "nvidia.com/gpu"
    names = {d["name"] for d in spec["devices"]}
    assert {str(g["index"]) for g in sim_node["gpus"]} | {"all"} <= names


def _run_start(start: str, env: dict[str, str], output) -> dict:
    """The unit's ExecStart (nvct's nvidia-ctk for /usr/bin's) under ``env``: the spec it wrote at ``output``."""
    argv = [os.path.join(VENV_BIN, "nvidia-ctk"), *shlex.split(start)[1:]]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(output.read_text())


def _environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads an EnvironmentFile (comments and blank lines skipped, quotes removed)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return out


def test_the_env_file_configures_generate_as_documented(sim_node, tmp_path):
    """nvidia-cdi-refresh.env holds the reference's NVIDIA_CTK_CDI_GENERATE_* variables (mig-parted's
    management mode, another kind, feature flags), and they win over the unit's Environment=."""
    directives = _directives(SERVICE)
    start = _generate_line(directives)
    output = tmp_path / "management.yaml"
    env_file = tmp_path / "nvidia-cdi-refresh.env"
    env_file.write_text(
        "# as an admin writes it\n"
        f"NVIDIA_CTK_CDI_OUTPUT_FILE_PATH={output}\n"
        "NVIDIA_CTK_CDI_GENERATE_MODE=management\n"
        'NVIDIA_CTK_CDI_GENERATE_VENDOR="management.nvidia.com"\n'
        "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS=disable-ipc-discoverer\n"
        "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS=enable-cuda-compat\n"
        "NVIDIA_CTK_CDI_HOOK_PATH=/usr/bin/nvidia-cdi-hook\n")
    env = dict(e.split("=", 1) for e in directives["Environment"])
    env.update(_environment_file(env_file.read_text()), PATH="/usr/bin:/bin",
               NVIDIA_CTK_CONFIG_FILE_PATH=sim_node["config"])
    spec = _run_start(start, env, output)
    assert spec["kind"] == "management.nvidia.com/gpu"
    assert {"all", sim_node["gpus"][0]["uuid"]} <= {d["name"] for d in spec["devices"]}
    (hook,) = spec["containerEdits"]["hooks"]
    assert hook["path"] == "/usr/bin/nvidia-cdi-hook" and "enable-cuda-compat" not in hook["args"]
    targets = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert not any(t.startswith("/run/nvidia-") for t in targets)


def test_generate_help_lists_every_variable_the_env_file_may_set():
    """The reference's env file points at ``nvidia-ctk cdi generate --help`` for the variables."""
    proc = subprocess.run([os.path.join(VENV_BIN, "nvidia-ctk"), "cdi", "generate", "--help"],
                          capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", "COLUMNS": "400"})
    g = "NVIDIA_CTK_CDI_GENERATE_"
    for var in ("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", "NVIDIA_CTK_DRIVER_ROOT", "NVIDIA_CTK_DEV_ROOT",
                "NVIDIA_CTK_CDI_HOOK_PATH", *(g + v for v in (
                    "MODE", "OUTPUT_FORMAT", "DEVICE_NAME_STRATEGIES", "DEVICE_IDS", "NO_ALL_DEVICE", "VENDOR",
                    "CLASS", "DISABLED_HOOKS", "ENABLED_HOOKS", "FEATURE_FLAGS", "LIBRARY_SEARCH_PATHS",
                    "CONFIG_SEARCH_PATHS", "LDCONFIG_PATH", "CSV_FILES", "CSV_IGNORE_PATTERNS",
                    "CSV_CONTAINER_COMPAT_ROOT"))):
        assert var in proc.stdout, var


def test_a_reader_never_sees_half_a_spec(sim_node, tmp_path):
    """The service regenerates a spec engines read at any time: each read is the old spec or the new one."""
    import threading

    output = tmp_path / "nvidia.yaml"
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"],
           "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH": str(output)}
    argv = [os.path.join(VENV_BIN, "nvidia-ctk"), "cdi", "generate"]
    subprocess.run(argv, env=env, capture_output=True, check=True)
    whole = output.read_bytes()
    done = threading.Event()
    reads, torn = [0], []

    def read() -> None:
        while not done.is_set():
            content = output.read_bytes()  # never missing: the new file replaces the old by rename
            reads[0] += 1
            if content != whole and len(torn) < 3:
                torn.append(content[-200:])

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(3):
            subprocess.run(argv, env=env, capture_output=True, check=True)
    finally:
        done.set()
        reader.join()
    assert reads[0] > 3 and torn == []
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.yaml"]  # no temporary file left
