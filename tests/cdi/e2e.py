"""What a container given a CDI device of the simulated node must see, and how to look."""

from __future__ import annotations

import os

#: Run inside the container: device nodes, what the loader finds, what NVML shows, the MPS mount.
CHECK_SCRIPT = (
    "echo '== nodes'; find /dev -name 'nvidia*' -type c | sort; "
    "echo '== probe'; /usr/local/bin/dlopen-probe libcuda.so.1 libnvidia-ml.so.1; echo \"probe-rc=$?\"; "
    "echo '== smi'; nvidia-smi -L; "
    "echo '== mps'; grep ' /tmp/nvidia-mps ' /proc/self/mountinfo | cut -d' ' -f5,6"
)

#: The devices every test requests: a whole GPU (with MIG enabled), all, a MIG device.
DEVICES = ("0", "all", "0:0")


def sections(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:], [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


def expected(node: dict, device: str) -> tuple[set[str], set[str]]:
    """(/dev/nvidia* character devices, GPU and MIG UUIDs nvidia-smi -L lists) for ``device``."""
    gpus = node["gpus"]
    if device == "all":
        chosen = [(g, g["mig_devices"]) for g in gpus]
    elif ":" in device:
        g, m = (int(x) for x in device.split(":"))
        chosen = [(gpus[g], [gpus[g]["mig_devices"][m]])]
    else:
        chosen = [(gpus[int(device)], [])]
    nodes = {n["path"] for n in node["device_nodes"] if n["role"] in ("control", "uvm", "modeset")}
    uuids = set()
    for gpu, migs in chosen:
        nodes.add(gpu["device_node"])
        uuids.add(gpu["uuid"])
        for mig in migs:
            nodes |= {f"/dev/nvidia-caps/nvidia-cap{mig['gi_cap_minor']}",
                      f"/dev/nvidia-caps/nvidia-cap{mig['ci_cap_minor']}"}
            uuids.add(mig["uuid"])
    return nodes, uuids


def assert_container_sees(result, node: dict, device: str) -> None:
    """``result`` (a tests.support Result) of CHECK_SCRIPT shows exactly ``device``."""
    assert result.ok, result.describe()
    found = sections(result.stdout)
    nodes, uuids = expected(node, device)
    assert set(found.get("nodes", [])) == nodes, result.describe()
    probe = found.get("probe", [])
    assert "probe-rc=0" in probe, result.describe()
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        assert f"ok {soname} /usr/lib/x86_64-linux-gnu/{soname}" in probe, result.describe()
    listed = {line.rsplit("(UUID: ", 1)[1].rstrip(")") for line in found.get("smi", []) if "(UUID: " in line}
    assert listed == uuids, result.describe()
    # The host's MPS pipe dir, read-write as libnvidia-container mounts it (by the hook in CDI specs).
    (mps,) = found.get("mps") or [""]
    where, _, options = mps.partition(" ")
    assert where == "/tmp/nvidia-mps", result.describe()
    assert {"rw", "nosuid", "nodev", "noexec"} <= set(options.split(",")), result.describe()


def generate_spec_text(entry_points: dict, node: dict, vendor: str = "nvidia.com", *,
                       program: str | None = None, hook_path: str | None = None) -> str:
    """``nvct cdi generate`` for ``node`` (YAML), with the hook pointing at our nvct.

    ``program`` runs instead of nvct (``nvidia-ctk``), ``hook_path`` is given as
    ``--nvidia-cdi-hook-path`` (the GPU Operator's flag).
    """
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    proc = subprocess.run([program or entry_points["nvct"], "cdi", "generate", "--vendor", vendor,
                           "--nvidia-cdi-hook-path", hook_path or entry_points["nvct"]],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
