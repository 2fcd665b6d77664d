"""The installation's steps: the toolkit tree, the host check, CDI, the engine's config -- and their undo."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from nvct.base.errors import ConfigError, NvctError
from nvct.cdi import spec as cdi_spec
from nvct.config import file as nvct_config
from nvct.toolkit import Installation, Interrupted, Layout, Options

WRAPPERS = ["nvct", "nvidia-cdi-hook", "nvidia-container-cli", "nvidia-container-runtime",
            "nvidia-container-runtime-hook", "nvidia-container-runtime.cdi", "nvidia-container-runtime.legacy",
            "nvidia-ctk"]


def _options(tmp_path, **kwargs) -> Options:
    kwargs.setdefault("no_runtime_config", True)
    kwargs.setdefault("driver_root", "/")
    kwargs.setdefault("python", sys.executable)
    return Options(install_dir=str(tmp_path / "install"), host_root="/", **kwargs)


def _install(opts: Options) -> tuple[Installation, list]:
    log = []
    inst = Installation(opts, log.append)
    inst.install()
    return inst, log


def test_the_toolkit_tree(tmp_path):
    inst, log = _install(_options(tmp_path, python="bundled"))
    root = tmp_path / "install" / "toolkit"
    assert sorted(p for p in os.listdir(root) if not p.startswith(".")) == WRAPPERS
    for name in WRAPPERS:
        st = os.stat(root / name)
        assert stat.S_IMODE(st.st_mode) == 0o755, name
        assert (root / name).read_text().startswith("#!/bin/sh\n")
    assert sorted(os.listdir(root / ".config" / "nvidia-container-runtime")) == [
        "config.cdi.toml", "config.legacy.toml", "config.toml"]
    python = root / ".runtime" / "current" / "lib" / "python"
    assert (python / "nvct" / "toolkit" / "entry.py").is_file()
    for dep in ("click", "tomlkit", "yaml"):
        assert (python / dep / "__init__.py").is_file(), dep
    assert not (python / "elftools").exists()  # a test dependency only
    # Compiled at install (the bundled interpreter is the installer's own).
    assert list((python / "nvct" / "programs" / "__pycache__").glob(f"shim.{sys.implementation.cache_tag}.pyc"))
    assert "host check: ok: Python" in "\n".join(log)
    assert "/.runtime/nvct-" in "\n".join(log)
    assert os.listdir(tmp_path / "install") == ["toolkit"]  # no staging directory left behind


def test_the_installed_configs_point_at_the_node_and_the_toolkit(tmp_path):
    node = tmp_path / "node"
    opts = _options(tmp_path, driver_root=str(node), dev_root=str(node), proc_root=str(node / "proc"),
                    runtime_mode="jit-cdi", low_level_runtimes=["/usr/sbin/runc"])
    _install(opts)
    layout = Layout.for_install_dir(opts.install_dir)
    main = nvct_config.load(layout.config())
    assert main.driver_root == str(node) and main.dev_root == str(node) and main.proc_root == str(node / "proc")
    assert main.mode == "jit-cdi"
    assert main.runtimes == ["/usr/sbin/runc"]
    assert main.get("nvct.path") == layout.nvct
    assert main.get("nvidia-container-runtime-hook.path") == layout.hook
    assert main.get("nvidia-container-runtime-hook.skip-mode-detection") is True
    assert main.get("nvidia-container-cli.ldconfig") == "@/sbin/ldconfig"  # the node has none of its own
    for mode in ("cdi", "legacy"):
        forced = nvct_config.load(layout.config(mode))
        assert forced.mode == mode
        assert forced.data == {**main.data, "nvidia-container-runtime": {
            **main.data["nvidia-container-runtime"], "mode": mode}}


def test_ldconfig_comes_from_the_driver_root_when_it_has_one(tmp_path):
    driver = tmp_path / "driver"
    (driver / "sbin").mkdir(parents=True)
    (driver / "sbin" / "ldconfig.real").write_text("")
    opts = _options(tmp_path, driver_root="/run/nvidia/driver", driver_root_ctr_path=str(driver))
    _install(opts)
    main = nvct_config.load(Layout.for_install_dir(opts.install_dir).config())
    assert main.get("nvidia-container-cli.ldconfig") == "@/run/nvidia/driver/sbin/ldconfig.real"
    assert main.driver_root == "/run/nvidia/driver"


def test_a_reinstall_replaces_the_tree_whole(tmp_path):
    _install(_options(tmp_path))
    stale = tmp_path / "install" / "toolkit" / "stale-file"
    stale.write_text("from an older version")
    _install(_options(tmp_path, runtime_mode="legacy"))
    assert not stale.exists()
    assert os.listdir(tmp_path / "install") == ["toolkit"]
    assert nvct_config.load(str(tmp_path / "install/toolkit/.config/nvidia-container-runtime/config.toml")
                            ).mode == "legacy"


def test_an_upgrade_switches_to_a_new_runtime_and_keeps_only_the_previous_one(tmp_path):
    runtimes = tmp_path / "install" / "toolkit" / ".runtime"
    versions = []
    for _ in range(3):
        _install(_options(tmp_path))
        versions.append(os.readlink(runtimes / "current"))
        assert f"/.runtime/{versions[-1]}/" in (tmp_path / "install" / "toolkit" / "nvct").read_text()
    assert len(set(versions)) == 3
    assert sorted(os.listdir(runtimes)) == sorted(["current", *versions[1:]])


def test_container_starts_during_upgrades_always_find_a_whole_runtime(tmp_path):
    _install(_options(tmp_path, python="bundled"))
    hook = str(tmp_path / "install" / "toolkit" / "nvidia-cdi-hook")
    stop = threading.Event()
    failures: list = []

    def start_hooks():
        while not stop.is_set():
            proc = subprocess.run([hook, "--version"], capture_output=True, text=True, check=False,
                                  env={"PATH": "/usr/bin:/bin"})
            if proc.returncode != 0:
                failures.append(proc.stderr)

    starter = threading.Thread(target=start_hooks)
    starter.start()
    try:
        for _ in range(3):
            _install(_options(tmp_path, python="bundled"))
    finally:
        stop.set()
        starter.join()
    assert failures == []


def test_uninstall_removes_the_tree(tmp_path):
    inst, log = _install(_options(tmp_path))
    inst.uninstall()
    assert os.listdir(tmp_path / "install") == []
    assert f"removed {tmp_path}/install/toolkit" in log


def test_a_host_python_that_cannot_run_nvct_stops_the_install(tmp_path):
    opts = _options(tmp_path, python=str(tmp_path / "no-python3"))
    with pytest.raises(NvctError, match="the host cannot run nvct .*no-python3.*the host needs python3 >= 3.9"):
        _install(opts)
    assert os.listdir(tmp_path / "install") == []


def test_a_bad_engine_config_stops_the_install_and_undoes_it(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text("{not json")
    opts = _options(tmp_path, no_runtime_config=False, runtime="docker", config=str(config), restart_mode="none")
    with pytest.raises(ConfigError, match=f"{config}: invalid JSON"):
        _install(opts)
    assert config.read_text() == "{not json"
    assert not (tmp_path / "install" / "toolkit").exists()


def test_the_engine_gets_three_runtimes_and_loses_them_byte_for_byte(tmp_path):
    config = tmp_path / "config.toml"
    original = "# the node's own\nversion = 2\n\n[plugins]\n"
    config.write_text(original)
    opts = _options(tmp_path, no_runtime_config=False, runtime="containerd", config=str(config),
                    restart_mode="none", config_sources=["file"], cdi_annotation_prefixes=["cdi.k8s.io/"])
    inst, _ = _install(opts)
    drop_in = (tmp_path / "conf.d" / "99-nvidia.toml").read_text()
    toolkit = tmp_path / "install" / "toolkit"
    for _name, suffix in (("nvidia", ""), ("nvidia-cdi", ".cdi"), ("nvidia-legacy", ".legacy")):
        assert f'BinaryName = "{toolkit}/nvidia-container-runtime{suffix}"' in drop_in
    assert 'container_annotations = ["cdi.k8s.io/*"]' in drop_in
    assert 'default_runtime_name = "nvidia"' in drop_in
    assert "imports" in config.read_text()
    inst.uninstall()
    assert config.read_text() == original
    assert sorted(os.listdir(tmp_path)) == ["config.toml", "install"]


def test_a_stop_during_the_install_undoes_what_was_done(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text("{}\n")
    calls = []

    def stop_after_two_steps() -> bool:
        calls.append(1)
        return len(calls) > 2

    opts = _options(tmp_path, no_runtime_config=False, runtime="docker", config=str(config), restart_mode="none")
    with pytest.raises(Interrupted):
        Installation(opts, lambda _: None).install(stop_after_two_steps)
    assert os.listdir(tmp_path / "install") == []
    assert config.read_text() == "{}\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a simulated node's device nodes)")
def test_cdi_enabled_writes_a_management_spec_and_control_nodes(tmp_path, sim_node):
    roots = sim_node["roots"]
    dev = tmp_path / "dev-root"
    opts = _options(tmp_path, cdi_enabled=True, cdi_output_dir=str(tmp_path / "cdi"), driver_root=roots["driver_root"],
                    dev_root=str(dev), proc_root=roots["proc_root"])
    inst, log = _install(opts)
    assert (dev / "dev" / "nvidiactl").is_char_device()
    spec = cdi_spec.read(str(tmp_path / "cdi" / "management.nvidia.com-gpu.yaml"))
    assert spec.raw["kind"] == "management.nvidia.com/gpu"
    names = {d["name"] for d in spec.raw["devices"]}
    assert {"all", "0", sim_node["gpus"][0]["uuid"]} <= names  # a device plugin may ask for one by UUID
    hooks = spec.raw["containerEdits"]["hooks"]
    assert hooks and all(h["path"] == str(tmp_path / "install" / "toolkit" / "nvct") for h in hooks)
    inst.uninstall()
    assert os.listdir(tmp_path / "cdi") == []
    assert (dev / "dev" / "nvidiactl").is_char_device()  # nodes belong to the node: they stay


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a simulated node's device nodes)")
def test_without_dev_root_the_driver_root_holds_the_nodes(tmp_path, sim_node):
    """The GPU Operator's layout: no --dev-root, nodes under the driver root (the reference's NVIDIA_DEV_ROOT)."""
    roots = sim_node["roots"]
    opts = _options(tmp_path, cdi_enabled=True, cdi_output_dir=str(tmp_path / "cdi"),
                    driver_root=roots["driver_root"], proc_root=roots["proc_root"])
    _install(opts)
    layout = Layout.for_install_dir(opts.install_dir)
    installed = nvct_config.load(layout.config(), env={})
    assert installed.get("nvct.dev-root") == "" and installed.dev_root == roots["driver_root"]
    spec = cdi_spec.read(str(tmp_path / "cdi" / "management.nvidia.com-gpu.yaml"))
    nodes = [n for d in spec.raw["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert nodes and {n["hostPath"] for n in nodes} >= {f"{roots['driver_root']}/dev/nvidiactl"}
    assert all(n["hostPath"].startswith(roots["driver_root"] + "/dev/") for n in nodes)


def test_options_are_checked_before_anything_is_done(tmp_path):
    with pytest.raises(ConfigError, match="--toolkit-install-dir: 'relative' is not an absolute path"):
        Options(install_dir="relative").resolved()
    with pytest.raises(ConfigError, match="--config-source: 'file=x': 'x' is not an absolute path"):
        Options(config_sources=["file=x"]).resolved()
    with pytest.raises(ConfigError, match="--create-device-nodes: 'all' is not one of control, none"):
        Options(create_device_nodes=["all"]).resolved()
    assert not (tmp_path / "install").exists()


def test_the_reference_programs_run_from_the_toolkit_directory(tmp_path):
    _install(_options(tmp_path))
    root = tmp_path / "install" / "toolkit"
    for program, first in (("nvidia-cdi-hook", "NVIDIA CDI Hook version"),
                           ("nvidia-ctk", "NVIDIA Container Toolkit CLI version"),
                           ("nvidia-container-cli", "cli-version:")):
        proc = subprocess.run([str(root / program), "--version"], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, check=False)
        assert proc.returncode == 0 and proc.stdout.startswith(first), (program, proc.stderr)
    unknown = subprocess.run([str(root / "nvidia-cdi-hook"), "no-such-hook"], input="{}", capture_output=True,
                             text=True, env={}, check=False)
    assert unknown.returncode == 0 and "unknown hook 'no-such-hook'" in unknown.stderr


# --------------------------------------------------------------------------- who can change the tree


def _loose(root) -> list[str]:
    """Entries under ``root`` that someone other than the installer could change."""
    out = []
    for directory, dirs, files in os.walk(root):
        for path in [directory] + [os.path.join(directory, n) for n in dirs + files]:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or (not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022):
                out.append(f"{path} {stat.S_IMODE(st.st_mode):04o} uid {st.st_uid}")
    return out


def _permissions_finding(root, tmp_path) -> dict:
    """``nvct doctor``'s permissions.chain, run by the toolkit's own nvct as an engine finds it."""
    import json

    daemon = tmp_path / "daemon.json"
    daemon.write_text(json.dumps({"runtimes": {"nvidia": {"path": str(root / "nvidia-container-runtime")}}}))
    proc = subprocess.run([str(root / "nvct"), "doctor", "--json", "--docker-config", str(daemon),
                           "--docker-socket", str(tmp_path / "no.sock"), "--docker-pidfile", str(tmp_path / "no.pid")],
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.stdout.startswith("{"), proc.stderr
    findings = {f["id"]: f for f in json.loads(proc.stdout)["findings"]}
    return findings["permissions.chain"]


def test_a_toolkit_installed_under_umask_000_only_root_can_change_and_doctor_names_a_loosened_library(tmp_path):
    from tests.support.fixtures import need_root

    need_root("the doctor checks that the chain is root-owned")
    old = os.umask(0)
    try:
        _install(_options(tmp_path, python="bundled"))
        _install(_options(tmp_path, python="bundled"))  # an upgrade too
    finally:
        os.umask(old)
    root = tmp_path / "install" / "toolkit"
    assert _loose(root) == []
    assert stat.S_IMODE(os.stat(root / ".runtime" / "current" / "bin" / "python3.11._pth").st_mode) == 0o644
    finding = _permissions_finding(root, tmp_path)
    assert finding["status"] == "ok", finding
    lib = next((root / ".runtime" / "current" / "lib").glob("libz.so*"))
    lib.chmod(0o666)
    finding = _permissions_finding(root, tmp_path)
    assert finding["status"] == "fail" and f"{lib.resolve()} (mode 0666, world-writable)" in finding["seen"], finding
    assert finding["fix"].startswith(f"chmod -R go-w {root}")  # the whole tree, in one command


def test_with_the_hosts_python_the_tree_is_compiled_and_root_only_too(tmp_path):
    old = os.umask(0)
    try:
        _install(_options(tmp_path))  # the host check runs that Python in the tree: it writes nothing there
    finally:
        os.umask(old)
    root = tmp_path / "install" / "toolkit"
    assert _loose(root) == []
    python = root / ".runtime" / "current" / "lib" / "python"
    assert list((python / "nvct" / "programs" / "__pycache__").glob(f"shim.{sys.implementation.cache_tag}.pyc"))


def test_an_upgrade_mends_the_directories_it_writes_into(tmp_path):
    _install(_options(tmp_path))
    config_dir = tmp_path / "install" / "toolkit" / ".config"
    config_dir.chmod(0o777)
    _install(_options(tmp_path))
    assert _loose(tmp_path / "install" / "toolkit") == []


def test_a_tree_with_an_entry_it_cannot_make_safe_is_not_switched_in(tmp_path, monkeypatch):
    from nvct.toolkit import payload

    _install(_options(tmp_path))
    root = tmp_path / "install" / "toolkit"
    before = os.readlink(root / ".runtime" / "current")
    copy = payload.copy_python

    def copy_with_a_fifo(dest, *args):
        copied = copy(dest, *args)
        os.mkfifo(os.path.join(dest, "planted"))
        return copied

    monkeypatch.setattr(payload, "copy_python", copy_with_a_fifo)
    with pytest.raises(NvctError) as raised:
        _install(_options(tmp_path))
    message = str(raised.value)
    assert "\n" not in message and "/lib/python/planted: not a file or directory" in message, message
    assert f"so the toolkit is not switched in at {root}" in message
    assert os.readlink(root / ".runtime" / "current") == before  # the old tree runs on
    assert sorted(os.listdir(root / ".runtime")) == sorted(["current", before])


def test_an_install_directory_others_can_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: anyone could rename the toolkit away and put theirs in its place
    opts = Options(install_dir=str(shared / "nvidia"), host_root="/", no_runtime_config=True,
                   driver_root="/", python=sys.executable)
    with pytest.raises(NvctError, match=rf"^{shared}: mode 0777, world-writable: anyone who can change it "
                                        rf"gets root at the next GPU container start, so the toolkit is not "
                                        rf"switched in at {shared}/nvidia/toolkit$"):
        _install(opts)
    assert os.listdir(shared) == []
