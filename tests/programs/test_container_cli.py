"""``nvidia-container-cli`` info, list and configure, field by field against libnvidia-container's formats.

The formats (src/cli/info.c, list.c of libnvidia-container): ``info`` prints
``%-15s %s`` lines -- ``NVRM version:``, ``CUDA version:``, then per GPU after
a blank line ``Device Index:``, ``Device Minor:``, ``Model:``, ``Brand:``,
``GPU UUID:``, ``Bus Location:``, ``Architecture:``; ``--csv`` prints the
header rows ``NVRM version,CUDA version`` and ``Device Index,Device Minor,
Model,Brand,GPU UUID,Bus Location,Architecture``. ``list`` prints host
paths, one a line: control nodes, GPU nodes, MIG files, binaries,
libraries (32-bit after), IPC; without flags everything.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from nvct.programs import container_cli
from nvct.programs.options import NO, OPTIONAL, YES, Option, UsageError, parse
from tests.e2e.conftest import VENV_BIN

CLI = os.path.join(VENV_BIN, "nvidia-container-cli")
FIELDS = ("Device Index", "Device Minor", "Model", "Brand", "GPU UUID", "Bus Location", "Architecture")


def run_cli(sim_node, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": sim_node["config"]}
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, check=False)


def expected_gpu(gpu: dict) -> dict:
    domain, rest = gpu["bus_id"].split(":", 1)
    return {"Device Index": str(gpu["index"]), "Device Minor": str(gpu["minor"]), "Model": gpu["model"],
            "Brand": container_cli.BRANDS[gpu["brand"]], "GPU UUID": gpu["uuid"],
            "Bus Location": f"{int(domain, 16):08x}:{rest}", "Architecture": gpu["arch"]}


def test_info_prints_libnvidia_containers_fields(sim_node):
    proc = run_cli(sim_node, "info")
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.rstrip("\n").split("\n\n")
    assert blocks[0].splitlines() == [f"{'NVRM version:':<15} {sim_node['driver_version']}",
                                      f"{'CUDA version:':<15} {sim_node['cuda_version']}"]
    assert len(blocks) == 1 + len(sim_node["gpus"])
    for block, gpu in zip(blocks[1:], sim_node["gpus"]):
        want = expected_gpu(gpu)
        assert block.splitlines() == [f"{k + ':':<15} {want[k]}" for k in FIELDS]


def test_info_csv(sim_node):
    proc = run_cli(sim_node, "info", "--csv")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:4] == ["NVRM version,CUDA version", f"{sim_node['driver_version']},{sim_node['cuda_version']}",
                         "", ",".join(FIELDS)]
    for line, gpu in zip(lines[4:], sim_node["gpus"]):
        want = expected_gpu(gpu)
        assert line.split(",") == [want[k] for k in FIELDS]
    assert len(lines) == 4 + len(sim_node["gpus"])


def test_list_without_flags_prints_everything_as_host_paths(sim_node):
    proc = run_cli(sim_node, "list")
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.splitlines()
    dev, root, proc_root = (sim_node["roots"][k] for k in ("dev_root", "driver_root", "proc_root"))
    control = [f"{dev}/dev/{n}" for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")]
    gpus = [f"{dev}{g['device_node']}" for g in sim_node["gpus"]]
    assert paths[:len(control) + len(gpus)] == control + gpus
    assert f"{proc_root}/driver/nvidia/capabilities/mig/config" in paths
    assert f"{proc_root}/driver/nvidia/capabilities/mig/monitor" in paths
    libs = [root + lib["path"] for lib in sim_node["libraries"]]
    assert set(libs) <= set(paths)
    assert {root + b["path"] for b in sim_node["binaries"]} <= set(paths)
    # binaries, then 64-bit libraries, then 32-bit ones
    first_lib = min(paths.index(p) for p in libs)
    assert all(paths.index(root + b["path"]) < first_lib for b in sim_node["binaries"])
    lib32 = [root + lib["path"] for lib in sim_node["libraries"] if lib["arch"] == "i386"]
    lib64 = [root + lib["path"] for lib in sim_node["libraries"] if lib["arch"] != "i386"]
    if lib32:
        assert max(paths.index(p) for p in lib64) < min(paths.index(p) for p in lib32)
    assert all(os.path.exists(p) for p in paths), [p for p in paths if not os.path.exists(p)]


def test_list_one_device_and_only_libraries(sim_node):
    proc = run_cli(sim_node, "list", "--device=1")
    dev = sim_node["roots"]["dev_root"]
    assert proc.stdout.splitlines() == [f"{dev}/dev/{n}" for n in
                                        ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")] + [
        f"{dev}{sim_node['gpus'][1]['device_node']}"]
    libs = run_cli(sim_node, "list", "-l").stdout.splitlines()
    root = sim_node["roots"]["driver_root"]
    assert libs == [root + lib["path"] for lib in sim_node["libraries"] if lib["arch"] != "i386"]


def test_version_and_bad_command_lines(sim_node):
    version = run_cli(sim_node, "--version")
    assert version.returncode == 0 and version.stdout.startswith("cli-version: ")
    assert "nvct" in version.stdout
    for argv, message in ((["frobnicate"], "unknown command 'frobnicate'"),
                          (["configure"], "expected exactly one ROOTFS"),
                          (["configure", "/"], "invalid rootfs directory '/'"),
                          (["configure", "--pid=x", "/r"], "invalid --pid 'x'"),
                          (["configure", "--device=9", "--pid=1", "/r"], "--device: unknown device '9'"),
                          (["list", "--device"], "requires an argument"),
                          (["--bogus", "info"], "unrecognized option '--bogus'")):
        proc = run_cli(sim_node, *argv)
        assert proc.returncode == 1 and message in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_configure_request_from_the_flags_containerd_passes():
    values, rest = parse(["--load-kmods", "configure", "--device=0", "--compute", "--compat32", "--graphics",
                          "--utility", "--video", "--display", "--pid=42", "/rootfs"],
                         container_cli.GLOBAL, in_order=True)
    assert values == {"load-kmods": True} and rest[0] == "configure"
    opts, operands = parse(rest[1:], container_cli.CONFIGURE)
    assert operands == ["/rootfs"] and opts["pid"] == "42"
    request = container_cli.configure_request(opts)
    assert request.devices == ("0",)
    assert request.capabilities == ("compat32", "compute", "display", "graphics", "utility", "video")
    opts, _ = parse(["--device", "GPU-x,1", "-r", "cuda>=12.0", "--mig-config=0", "/r"], container_cli.CONFIGURE)
    request = container_cli.configure_request(opts)
    assert request.devices == ("GPU-x", "1") and request.mig_config == ("0",)
    assert [expr for _, expr in request.requirements] == ["cuda>=12.0"]


def test_option_parser_follows_argp():
    spec = [Option("debug", "d", YES), Option("load-kmods", "k", NO), Option("user", "u", OPTIONAL),
            Option("device", "D", YES, repeat=True)]
    assert parse(["-kdFILE", "-u", "x"], spec) == ({"load-kmods": True, "debug": "FILE", "user": True}, ["x"])
    assert parse(["--user=1:2", "--dev", "0", "--device=1"], spec)[0] == {"user": "1:2", "device": ["0", "1"]}
    assert parse(["-k", "cmd", "-d", "x"], spec, in_order=True) == ({"load-kmods": True}, ["cmd", "-d", "x"])
    with pytest.raises(UsageError, match="doesn't allow an argument"):
        parse(["--load-kmods=1"], spec)


def test_apptainers_and_enroots_command_lines_parse():
    # Apptainer --nvccli: --user before configure, --no-cgroups, --ldconfig=@..., env-derived flags, ROOTFS
    values, rest = parse(["--user", "configure", "--no-cgroups", "--device=0,1", "--mig-config=0",
                          "--compute", "--utility", "--require=cuda>=12.0", "--ldconfig=@/sbin/ldconfig", "/r"],
                         container_cli.GLOBAL, in_order=True)
    assert values == {"user": True}
    opts, operands = parse(rest[1:], container_cli.CONFIGURE)
    assert operands == ["/r"] and opts["ldconfig"] == "@/sbin/ldconfig" and opts["no-cgroups"] is True
    request = container_cli.configure_request(opts)
    assert request.devices == ("0", "1") and request.capabilities == ("compute", "utility")
    # enroot: --load-kmods configure --no-cgroups --pid=N --device=0,1 ROOTFS
    _, rest = parse(["--load-kmods", "configure", "--no-cgroups", "--pid=14592", "--device=0,1", "/r"],
                    container_cli.GLOBAL, in_order=True)
    opts, operands = parse(rest[1:], container_cli.CONFIGURE)
    assert opts["pid"] == "14592" and operands == ["/r"] and container_cli.configure_request(opts).capabilities == ()


def test_list_mig_files_follow_list_c(sim_node):
    gpu = next(g for g in sim_node["gpus"] if g["mig_enabled"])
    caps = f"{sim_node['roots']['proc_root']}/driver/nvidia/capabilities"
    mig = run_cli(sim_node, "list", f"--device={gpu['index']}:0").stdout.splitlines()
    assert [p for p in mig if p.startswith(caps)] == [f"{caps}/gpu{gpu['minor']}/mig/gi1/access",
                                                       f"{caps}/gpu{gpu['minor']}/mig/gi1/ci0/access"]
    config = run_cli(sim_node, "list", "--device=all", "--mig-config=all").stdout.splitlines()
    assert [p for p in config if p.startswith(caps)] == [f"{caps}/mig/config", f"{caps}/gpu{gpu['minor']}/mig"]
    refused = run_cli(sim_node, "list", f"--device={gpu['index']}:0", "--mig-monitor=all")
    assert refused.returncode == 1 and "cannot be used with specific MIG devices selected" in refused.stderr


def test_configure_keeps_the_global_flags_beside_its_own(tmp_path, monkeypatch):
    """``--root R --ldcache L configure --no-cgroups --ldconfig=@X ROOTFS`` (a driver container's
    root, as enroot or containerd's oci-hook pass it): configure's own flags once replaced the
    global ones, so the driver was looked for under the config's root, and ``--load-kmods`` absent
    loaded the modules anyway (the config's default)."""
    from nvct.modifier import legacy as realize

    seen = {}
    monkeypatch.setattr(realize, "legacy", lambda request, config, *a, **k: seen.setdefault("config", config))
    monkeypatch.setenv("NVIDIA_CTK_CONFIG_FILE_PATH", str(tmp_path / "absent.toml"))  # the built-in defaults
    argv = ["--root", "/run/nvidia/driver", "--ldcache", "/run/nvidia/driver/etc/ld.so.cache", "configure",
            "--no-cgroups", "--ldconfig=@/sbin/ldconfig.real", "--no-cntlibs", "--pid=1", "/r"]
    assert container_cli.main(argv) == 0
    config = seen["config"]
    assert (config.driver_root, config.cli_ldcache) == ("/run/nvidia/driver", "/run/nvidia/driver/etc/ld.so.cache")
    assert config.cli_load_kmods is False  # not asked for on the command line
    assert (config.cli_no_cgroups, config.cli_ldconfig) == (True, "@/sbin/ldconfig.real")
    assert config.legacy_cuda_compat_mode == "disabled"
