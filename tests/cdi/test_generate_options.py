"""``cdi generate``'s flags, variables and modes against the reference's documented behaviour.

Each run is a fresh ``nvct cdi generate`` (the click-less path), and where it
matters also ``--debug`` (click's path): both are built from one option table.
The reference's precedence is flag > variable > config file.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from nvct.cdi import spec as spec_mod
from tests.e2e.conftest import VENV_BIN

#: The reference's variables (urfave EnvVars of cmd/nvidia-ctk/cdi/generate).
_G = "NVIDIA_CTK_CDI_GENERATE_"


def _clean_env(node, extra=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = node["config"]
    env.update(extra or {})
    return env


def _generate(entry_points, node, *args, env=None, debug=False, program=None, ok=True):
    argv = [program or entry_points["nvct"], *(["--debug"] if debug else []), "cdi", "generate",
            "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_clean_env(node, env), timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def _spec(proc) -> dict:
    return spec_mod.parse(proc.stdout, "<stdout>").raw


def _steps(raw: dict) -> list[str]:
    """The step names of the spec's hook chain (none: no hook)."""
    hooks = raw.get("containerEdits", {}).get("hooks", [])
    if not hooks:
        return []
    (hook,) = hooks
    args = hook["args"][2:]  # nvidia-cdi-hook chain
    names, start = [], True
    for arg in args:
        if start:
            names.append(arg)
        start = arg == "--"
    return names


def _names(raw: dict) -> set[str]:
    return {d["name"] for d in raw["devices"]}


def _mount_targets(raw: dict) -> set[str]:
    return {m["containerPath"] for m in raw.get("containerEdits", {}).get("mounts", [])}


# --- variables -------------------------------------------------------------------------------

@pytest.mark.parametrize("debug", [False, True], ids=["fast", "click"])
@pytest.mark.parametrize("var, value, check", [
    (_G + "MODE", "management", lambda r, n: {"all", n["gpus"][0]["uuid"]} <= _names(r)
     and "deviceNodes" not in r["containerEdits"]),
    (_G + "DEVICE_NAME_STRATEGIES", "type-index,uuid",
     lambda r, n: {"gpu1", n["gpus"][1]["uuid"]} <= _names(r) and "1" not in _names(r)),
    (_G + "DEVICE_IDS", "1", lambda r, n: _names(r) == {"1", n["gpus"][1]["uuid"], "all"}),
    (_G + "NO_ALL_DEVICE", "true", lambda r, n: "all" not in _names(r)),
    (_G + "NO_ALL_DEVICE", "0", lambda r, n: "all" in _names(r)),
    (_G + "VENDOR", "example.com", lambda r, n: r["kind"] == "example.com/gpu"),
    (_G + "CLASS", "accel", lambda r, n: r["kind"] == "nvidia.com/accel"),
    (_G + "DISABLED_HOOKS", "all", lambda r, n: "hooks" not in r["containerEdits"]),
    (_G + "DISABLED_HOOKS", "create-symlinks,update-ldcache",
     lambda r, n: _steps(r) == ["check-requirements", "enable-cuda-compat", "disable-device-node-modification",
                                "bind-mount"]),
    (_G + "ENABLED_HOOKS", "chmod", lambda r, n: "chmod" not in _steps(r) and len(_steps(r)) == 6),
    (_G + "OUTPUT_FORMAT", "JSON", lambda r, n: r["kind"] == "nvidia.com/gpu"),
    (_G + "FEATURE_FLAGS", "disable-ipc-discoverer",
     lambda r, n: not {"/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"} & _mount_targets(r)
     and "bind-mount" not in _steps(r)),
    (_G + "LDCONFIG_PATH", "/sbin/ldconfig.real",
     lambda r, n: "/sbin/ldconfig.real" in r["containerEdits"]["hooks"][0]["args"]),
])
def test_each_variable_is_read(entry_points, node, var, value, check, debug):
    raw = _spec(_generate(entry_points, node, env={var: value}, debug=debug))
    assert check(raw, node), raw["devices"][:2]


def test_enabled_hooks_variable_overrides_disabled_ones(entry_points, node):
    env = {_G + "DISABLED_HOOKS": "all", _G + "ENABLED_HOOKS": "update-ldcache"}
    raw = _spec(_generate(entry_points, node, env=env))
    assert _steps(raw) == ["update-ldcache", "bind-mount"]


def test_the_format_variable_and_its_deprecated_alias(entry_points, node):
    proc = _generate(entry_points, node, env={_G + "OUTPUT_FORMAT": "json"})
    assert proc.stdout.startswith("{") and "deprecated" not in proc.stderr
    proc = _generate(entry_points, node, env={"NVIDIA_CTK_CDI_OUTPUT_FORMAT": "json"})
    assert proc.stdout.startswith("{")
    assert proc.stderr == ("nvct: warning: NVIDIA_CTK_CDI_OUTPUT_FORMAT is deprecated (NVIDIA's toolkit never "
                           f"read it): set {_G}OUTPUT_FORMAT\n")
    proc = _generate(entry_points, node, env={_G + "OUTPUT_FORMAT": "yaml", "NVIDIA_CTK_CDI_OUTPUT_FORMAT": "json"})
    assert not proc.stdout.startswith("{") and proc.stderr == ""


def test_json_asked_for_a_yaml_file_is_written_with_a_warning(entry_points, node, tmp_path):
    """The refresh unit's nvidia.yaml with NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT=json in its env file."""
    out = tmp_path / "nvidia.yaml"
    proc = _generate(entry_points, node,
                     env={_G + "OUTPUT_FORMAT": "json", "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH": str(out)})
    assert proc.stderr.startswith(f"nvct: warning: writing JSON to {out}, as --format asks")
    assert out.read_text().startswith("{") and spec_mod.read(str(out)).devices
    proc = _generate(entry_points, node, "--format", "yaml", "--output", str(tmp_path / "x.json"), ok=False)
    assert proc.returncode == 1 and proc.stderr == f"nvct: --format yaml does not match --output {tmp_path}/x.json\n"


def test_hook_path_variable(entry_points, node):
    raw = _spec(subprocess.run([entry_points["nvct"], "cdi", "generate"], capture_output=True, text=True,
                               env=_clean_env(node, {"NVIDIA_CTK_CDI_HOOK_PATH": "/opt/t/nvidia-ctk"}), check=True))
    (hook,) = raw["containerEdits"]["hooks"]
    assert hook["path"] == "/opt/t/nvidia-ctk" and hook["args"][:3] == ["nvidia-ctk", "hook", "chain"]


def test_roots_variables_beat_the_config_and_lose_to_flags(entry_points, node, tmp_path):
    bogus = str(tmp_path / "nowhere")
    proc = _generate(entry_points, node, env={"NVIDIA_CTK_DRIVER_ROOT": bogus}, ok=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"nvct: nvidia-container-cli.root: the driver root {bogus} does not exist; set it to the directory the "
        "driver is installed in\n")
    root = node["roots"]["driver_root"]
    raw = _spec(_generate(entry_points, node, "--driver-root", root, env={"NVIDIA_CTK_DRIVER_ROOT": bogus}))
    assert "0" in _names(raw)
    # The dev root follows the driver root the variable gave, as the reference's.
    raw = _spec(_generate(entry_points, node, env={"NVIDIA_CTK_DRIVER_ROOT": root}))
    assert raw["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"].startswith(root + "/dev/")
    raw = _spec(_generate(entry_points, node, env={"NVIDIA_CTK_DEV_ROOT": bogus}))
    assert raw["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"].startswith(bogus + "/dev/")


def test_flags_beat_variables(entry_points, node):
    raw = _spec(_generate(entry_points, node, "--mode", "nvml", "--vendor", "a.com", "--device-id", "0",
                          env={_G + "MODE": "management", _G + "VENDOR": "b.com", _G + "DEVICE_IDS": "1"}))
    assert raw["kind"] == "a.com/gpu" and "0" in _names(raw) and "1" not in _names(raw)


@pytest.mark.parametrize("env, message", [
    ({_G + "NO_ALL_DEVICE": "maybe"}, f"nvct: {_G}NO_ALL_DEVICE: 'maybe' is not a boolean (true or false)\n"),
    ({_G + "MODE": "bogus"}, f"nvct: {_G}MODE: invalid value 'bogus' (one of auto, nvml, management, gds, "
                             "mofed, gdrcopy, nvswitch, imex, csv, wsl, sandbox)\n"),
    ({_G + "MODE": "csv", _G + "CSV_FILES": "/nonexistent/devices.csv"},
     "nvct: /nonexistent/devices.csv: No such file or directory\n"),
    ({_G + "ENABLED_HOOKS": "all"}, "nvct: --enable-hook all: enabling all hooks is not supported\n"),
    ({_G + "LDCONFIG_PATH": "sbin/ldconfig"}, "nvct: --ldconfig-path: 'sbin/ldconfig' is not an absolute host path\n"),
    ({"NVIDIA_CTK_CDI_HOOK_PATH": "bin/nvct"}, "nvct: --nvidia-cdi-hook-path: 'bin/nvct' is not an absolute path\n"),
    ({"NVIDIA_CTK_CDI_HOOK_PATH": "no-such-program"},
     "nvct: --nvidia-cdi-hook-path: 'no-such-program' not found on PATH\n"),
])
def test_bad_variables_are_one_line(entry_points, node, env, message):
    proc = subprocess.run([entry_points["nvct"], "cdi", "generate"], capture_output=True, text=True,
                          env=_clean_env(node, env), timeout=60)
    assert proc.returncode == 1 and proc.stderr == message and proc.stdout == ""


@pytest.mark.parametrize("var, flag", [
    (_G + "LIBRARY_SEARCH_PATHS", "--library-search-path ignored"),
    (_G + "CONFIG_SEARCH_PATHS", "--config-search-path ignored"),
    (_G + "CSV_FILES", "--csv.file ignored: it applies to csv mode only"),
    (_G + "CSV_IGNORE_PATTERNS", "--csv.ignore-pattern ignored"),
    (_G + "CSV_CONTAINER_COMPAT_ROOT", "--csv.compat-container-root ignored"),
])
def test_options_nvct_does_not_use_are_warned_about(entry_points, node, var, flag):
    proc = _generate(entry_points, node, env={var: "/x"})
    assert proc.stderr.startswith(f"nvct: warning: {flag}") and len(proc.stderr.splitlines()) == 1


# --- flags -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, steps", [
    ((), ["check-requirements", "create-symlinks", "enable-cuda-compat", "update-ldcache",
          "disable-device-node-modification", "bind-mount"]),
    (("--disable-hook", "enable-cuda-compat"),
     ["check-requirements", "create-symlinks", "update-ldcache", "disable-device-node-modification", "bind-mount"]),
    (("--disable-hooks", "all", "--enable-hook", "update-ldcache"), ["update-ldcache", "bind-mount"]),
    (("--disable-hook", "update-ldcache", "--enable-hooks", "update-ldcache,chmod"),
     ["check-requirements", "create-symlinks", "enable-cuda-compat", "update-ldcache",
      "disable-device-node-modification", "bind-mount"]),
    (("--mode", "management"), ["create-symlinks", "enable-cuda-compat", "update-ldcache", "bind-mount"]),
    (("--mode", "management", "--enable-hook", "disable-device-node-modification"),
     ["create-symlinks", "enable-cuda-compat", "update-ldcache", "disable-device-node-modification",
      "bind-mount"]),
])
def test_hook_selection(entry_points, node, args, steps):
    proc = _generate(entry_points, node, *args)
    assert _steps(_spec(proc)) == steps
    assert proc.stderr == ""
    assert _steps(_spec(_generate(entry_points, node, *args, debug=True))) == steps


def test_all_hooks_off_leaves_the_mps_mount_out_with_a_warning(entry_points, node):
    proc = _generate(entry_points, node, "--disable-hooks", "all")
    raw = _spec(proc)
    assert "/tmp/nvidia-mps" not in _mount_targets(raw) and "hooks" not in raw["containerEdits"]
    assert "/tmp/nvidia-mps left out" in proc.stderr


def test_unknown_hooks_and_feature_flags_are_warned_about(entry_points, node):
    proc = _generate(entry_points, node, "--disable-hook", "no-such-hook", "--feature-flag", "no-such-flag",
                     "--feature-flags", "disable-multiple-csv-devices,disable-nvsandboxutils")
    flags, hooks = proc.stderr.splitlines()[:2], proc.stderr.splitlines()[2:]
    assert flags == [
        "nvct: warning: --feature-flag disable-multiple-csv-devices ignored: nvct's csv mode gives one device (all)",
        "nvct: warning: --feature-flag no-such-flag ignored: not a feature flag nvct or the reference knows",
    ]
    (hook,) = hooks
    assert hook.startswith("nvct: warning: --disable-hook no-such-hook ignored: not a hook name (one of "
                           "create-symlinks, enable-cuda-compat, update-ldcache, disable-device-node-modification, "
                           "chmod, update-application-profile") and hook.endswith(", or all)")
    assert _steps(_spec(proc))[:2] == ["check-requirements", "create-symlinks"]


def test_ldconfig_path_and_nvidia_ctk_path_flags(entry_points, node):
    raw = _spec(_generate(entry_points, node, "--ldconfig-path", "/sbin/ldconfig.real",
                          "--nvidia-ctk-path", "/opt/x/nvidia-ctk"))
    (hook,) = raw["containerEdits"]["hooks"]
    assert hook["path"] == "/opt/x/nvidia-ctk" and hook["args"][:3] == ["nvidia-ctk", "hook", "chain"]
    update = hook["args"][hook["args"].index("update-ldcache"):]
    assert update[update.index("--ldconfig-path") + 1] == "/sbin/ldconfig.real"


def test_a_bare_hook_program_name_is_found_on_path(entry_points, node):
    proc = _generate(entry_points, node, "--nvidia-cdi-hook-path", "nvidia-cdi-hook",
                     env={"PATH": VENV_BIN + ":/usr/bin:/bin"})
    (hook,) = _spec(proc)["containerEdits"]["hooks"]
    assert hook["path"] == os.path.join(VENV_BIN, "nvidia-cdi-hook")


def test_explicit_driver_libraries(entry_points, gated_node):
    plain = _spec(_generate(entry_points, gated_node))
    flagged = _spec(_generate(entry_points, gated_node, "--feature-flag", "enable-explicit-driver-libraries"))
    assert _mount_targets(flagged) - _mount_targets(plain) == {"/usr/lib/x86_64-linux-gnu/libEGL.so.1.1.0"}
    args = flagged["containerEdits"]["hooks"][0]["args"]
    assert "libEGL.so.1.1.0::/usr/lib/x86_64-linux-gnu/libEGL.so.1" in args
    assert "/usr/lib/x86_64-linux-gnu/libEGL.so.1" in args  # entered into the container's ld cache


# --- modes -----------------------------------------------------------------------------------

def _device_paths(raw: dict, name: str = "all") -> set[str]:
    (device,) = [d for d in raw["devices"] if d["name"] == name]
    return {n["path"] for n in device["containerEdits"].get("deviceNodes", [])}


@pytest.mark.parametrize("mode, nodes, mounts", [
    ("gds", {"/dev/nvidia-fs0", "/dev/nvidia-fs1"}, {"/etc/cufile.json", "/run/udev"}),
    ("mofed", {"/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"}, set()),
    ("gdrcopy", {"/dev/gdrdrv"}, set()),
    ("nvswitch", {"/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch0", "/dev/nvidia-nvswitch1"}, set()),
])
def test_subsystem_modes_give_one_all_device(entry_points, gated_node, mode, nodes, mounts):
    raw = _spec(_generate(entry_points, gated_node, "--mode", mode))
    assert raw["kind"] == "nvidia.com/gpu" and _names(raw) == {"all"}
    assert _device_paths(raw) == nodes
    (device,) = raw["devices"]
    assert {m["containerPath"] for m in device["containerEdits"].get("mounts", [])} == mounts
    assert not raw.get("containerEdits")  # no hooks, no env of its own, as the reference's
    spec_mod.validate(raw)


@pytest.mark.parametrize("mode", ["gds", "mofed", "gdrcopy", "nvswitch"])
def test_a_subsystem_mode_without_its_nodes_is_one_line(entry_points, node, mode):
    proc = _generate(entry_points, node, "--mode", mode, ok=False)
    assert proc.returncode == 1 and proc.stderr.startswith(f"nvct: --mode {mode}: no device nodes ")
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("args, names", [
    ((), {"0", "1", "all"}),
    (("--device-id", "channel1"), {"1", "all"}),
    (("--device-id", "0", "--no-all-device"), {"0"}),
])
def test_imex_mode_gives_a_device_per_channel(entry_points, gated_node, args, names):
    raw = _spec(_generate(entry_points, gated_node, "--mode", "imex", "--class", "imex-channel", *args))
    assert raw["kind"] == "nvidia.com/imex-channel" and _names(raw) == names
    for name in names - {"all"}:
        assert _device_paths(raw, name) == {f"/dev/nvidia-caps-imex-channels/channel{name}"}


@pytest.mark.parametrize("ident, message", [
    ("7", "IMEX channel 7 not found at "),
    ("1048576", "--device-id '1048576': not an IMEX channel (0 to 1048575, channelN, or all)"),
    ("x", "--device-id 'x': not an IMEX channel"),
])
def test_imex_mode_refuses_a_bad_channel(entry_points, gated_node, ident, message):
    proc = _generate(entry_points, gated_node, "--mode", "imex", "--device-id", ident, ok=False)
    assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_generated_specs_carry_no_additional_gids_and_stay_0_5(entry_points, gated_node):
    """A node only its group may open (render, 0660) gives no additionalGids in a generated spec, flag or
    not: they need CDI 0.7.0, which podman 4.3 cannot read (a deliberate difference; jit-cdi adds them)."""
    for args in ((), ("--feature-flag", "no-additional-gids-for-device-nodes")):
        raw = _spec(_generate(entry_points, gated_node, "--device-id", "0", *args))
        assert raw["cdiVersion"] == "0.5.0"
        assert all("additionalGids" not in d["containerEdits"] for d in raw["devices"])
        assert "/dev/dri/renderD128" in _device_paths(raw, "0")


# --- the reference's users ----------------------------------------------------------------------

def test_k8s_mig_managers_management_spec_pipeline(entry_points, node, tmp_path):
    """mig-parted's reconfigure-mig.sh (GPU Operator's MIG manager) with CDI enabled, verbatim but for roots."""
    ctk = os.path.join(VENV_BIN, "nvidia-ctk")
    root = node["roots"]["driver_root"]
    out = tmp_path / "management.nvidia.com-gpu.yaml"
    script = (
        f'{ctk} cdi generate --mode=management --driver-root="$R" --dev-root="$R" '
        f'--vendor="management.nvidia.com" --class="gpu" --nvidia-cdi-hook-path="$HOOK" | '
        f'{ctk} cdi transform root --from="$R" --to=/run/nvidia/driver --input="-" | '
        f'{ctk} cdi transform root --from="$R" --to=/ --input="-" --output="$OUT"')
    proc = subprocess.run(["sh", "-ec", script], capture_output=True, text=True, timeout=60,
                          env=_clean_env(node, {"R": root, "OUT": str(out),
                                                "HOOK": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}))
    assert proc.returncode == 0, proc.stderr
    raw = spec_mod.read(str(out)).raw
    assert raw["kind"] == "management.nvidia.com/gpu" and {"all", node["gpus"][0]["uuid"]} <= _names(raw)
    (every,) = [d for d in raw["devices"] if d["name"] == "all"]
    paths = {n["path"] for n in every["containerEdits"]["deviceNodes"]}
    assert {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1"} <= paths
    (hook,) = raw["containerEdits"]["hooks"]
    assert hook["path"] == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert "disable-device-node-modification" not in hook["args"]  # as the reference's management mode


def test_the_management_mode_variable_as_mig_parted_sets_it(entry_points, node):
    """``NVIDIA_CTK_CDI_GENERATE_MODE=management`` with the GPU Operator's kind and hook, as variables."""
    env = {_G + "MODE": "management", _G + "VENDOR": "management.nvidia.com",
           "NVIDIA_CTK_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
           "NVIDIA_CTK_DRIVER_ROOT": node["roots"]["driver_root"]}
    proc = subprocess.run([os.path.join(VENV_BIN, "nvidia-ctk"), "cdi", "generate"], capture_output=True,
                          text=True, env=_clean_env(node, env), timeout=60)
    assert proc.returncode == 0, proc.stderr
    raw = _spec(proc)
    assert raw["kind"] == "management.nvidia.com/gpu" and {"all", node["gpus"][0]["uuid"]} <= _names(raw)
    assert raw["containerEdits"]["hooks"][0]["path"] == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"


# --- jit-cdi's keys ------------------------------------------------------------------------------

def test_jit_cdi_keys_nvct_does_not_implement_are_warned_about(tmp_path):
    from nvct.base import log
    from nvct.cdi import features
    from nvct.config import file as config_mod

    key = "nvidia-container-runtime.modes.jit-cdi"
    conf = config_mod.Config({"nvidia-container-runtime": {"modes": {"jit-cdi": {
        "nvcdi-feature-flags": ["disable-multiple-csv-devices", "disable-nvsandbox-utils"],
        "nvcdi-disable-hooks": ["chmod", "typo"]}}}}, "config.toml", env={})
    log.setup(level="warning", path=str(tmp_path / "log"))
    try:
        generation = features.for_jit(conf)
    finally:
        log.setup()
    text = (tmp_path / "log").read_text()
    assert (f"{key}.nvcdi-feature-flags disable-multiple-csv-devices ignored: nvct's csv mode gives one device "
            "(all)") in text
    assert f"{key}.nvcdi-disable-hooks typo ignored: not a hook name" in text
    assert len(text.splitlines()) == 2 and "nvsandbox" not in text  # the old spelling is the reference's alias
    assert generation.features == {"disable-multiple-csv-devices", "disable-nvsandboxutils"}


def test_a_jit_cdi_key_of_the_wrong_type_is_one_line():
    from nvct.base.errors import ConfigError
    from nvct.cdi import features
    from nvct.config import file as config_mod

    conf = config_mod.Config({"nvidia-container-runtime": {"modes": {"jit-cdi": {"nvcdi-disable-hooks": 3}}}},
                             "config.toml", env={})
    with pytest.raises(ConfigError, match="^config.toml: nvidia-container-runtime.modes.jit-cdi.nvcdi-disable-hooks: "
                                          "must be a list of strings$"):
        features.for_jit(conf)


# --- coherent annotations --------------------------------------------------------------------------

def test_coherent_annotations_write_a_noncoherent_spec_beside_the_full_one(entry_points, node, tmp_path):
    """The simulated NVML has no nvmlDeviceGetAddressingMode: every GPU is non-coherent, as go-nvlib says."""
    out = tmp_path / "nvidia.yaml"
    proc = _generate(entry_points, node, "--feature-flag", "enable-coherent-annotations", "--output", str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.noncoherent.yaml", "nvidia.yaml"]
    assert proc.stderr.splitlines()[1] == (f"nvct: wrote {tmp_path}/nvidia.noncoherent.yaml "
                                           "(cdiVersion 0.6.0, 17 devices)")
    full, extra = (spec_mod.read(str(tmp_path / n)).raw for n in ("nvidia.yaml", "nvidia.noncoherent.yaml"))
    assert extra["kind"] == "nvidia.com/gpu.noncoherent"
    gpus = {str(g["index"]) for g in node["gpus"]} | {g["uuid"] for g in node["gpus"]}
    assert _names(extra) == gpus | {"all"}  # whole GPUs only, no MIG device
    assert _names(full) > _names(extra) and "0:0" in _names(full)
    assert full == _spec(_generate(entry_points, node, "--format", "yaml"))


def test_coherent_gpus_get_a_coherent_spec(node, tmp_path, monkeypatch):
    from nvct.cli import cdi_generate
    from nvct.discover import nvml

    from .conftest import node_config

    coherent = {node["gpus"][1]["uuid"], node["gpus"][5]["uuid"]}
    monkeypatch.setattr(nvml.Nvml, "coherent", lambda self, handle: self.uuid(handle) in coherent)
    for var in [v for v in os.environ if v.startswith("NVIDIA_CTK_")]:
        monkeypatch.delenv(var)
    message = cdi_generate.run(node_config(node), {"output": str(tmp_path / "nvidia.json"),
                                                   "feature_flags": ["enable-coherent-annotations"]})
    assert len(message.splitlines()) == 3
    raw = spec_mod.read(str(tmp_path / "nvidia.coherent.json")).raw
    assert raw["kind"] == "nvidia.com/gpu.coherent" and _names(raw) == {"1", "5", "all"} | coherent
    raw = spec_mod.read(str(tmp_path / "nvidia.noncoherent.json")).raw
    assert "1" not in _names(raw) and "0" in _names(raw)


@pytest.mark.parametrize("rc, value, coherent", [(0, 2, True), (0, 1, False), (0, 0, False), (3, 0, False)])
def test_nvml_coherence_is_ats_addressing(rc, value, coherent):
    import ctypes

    from nvct.discover import nvml

    seen = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    def get_mode(handle, mode):
        words = ctypes.cast(mode, ctypes.POINTER(ctypes.c_uint * 2)).contents
        seen.append(words[0])
        words[1] = value
        return rc

    lib = type("Lib", (), {"nvmlDeviceGetAddressingMode": get_mode})()
    n = object.__new__(nvml.Nvml)
    n._lib, n._path = lib, "libnvidia-ml.so.1"
    assert n.coherent(None) is coherent
    assert seen == [8 | 1 << 24]  # nvmlDeviceAddressingMode_v1
    n._lib = object()
    assert n.coherent(None) is False  # a driver without the call
