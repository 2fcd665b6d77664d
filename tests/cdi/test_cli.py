"""``nvct cdi generate|list|transform`` as fresh processes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile

import pytest
import yaml

from nvct.cdi import spec

from .conftest import minimal_spec, write_spec


def _nvct(entry_points, *args, config=None, stdin=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    if config:
        env["NVIDIA_CTK_CONFIG_FILE_PATH"] = config
    return subprocess.run([entry_points["nvct"], *args], capture_output=True, text=True, env=env,
                          input=stdin, timeout=60)


def test_generate_writes_a_valid_spec_atomically(entry_points, node, tmp_path):
    out = tmp_path / "cdi" / "nvidia.yaml"
    proc = _nvct(entry_points, "cdi", "generate", "--output", str(out), "--hook-path", "/usr/bin/nvct",
                 config=node["config"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    loaded = spec.read(str(out))
    assert proc.stderr == f"nvct: wrote {out} (cdiVersion 0.5.0, {len(loaded.devices)} devices)\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert os.listdir(out.parent) == ["nvidia.yaml"]


def test_generate_to_stdout_in_the_format_asked(entry_points, node):
    proc = _nvct(entry_points, "cdi", "generate", "--format", "json", "--device-id", "1",
                 "--device-name-strategy", "type-index", "--hook-path", "/usr/bin/nvct", config=node["config"])
    assert proc.returncode == 0, proc.stderr
    loaded = spec.parse(proc.stdout, "<stdout>")
    assert proc.stdout.startswith("{")
    assert list(loaded.devices) == ["all", "gpu1"]


def test_generate_format_follows_the_output_extension(entry_points, node, tmp_path):
    out = tmp_path / "nvidia.json"
    assert _nvct(entry_points, "cdi", "generate", "--output", str(out), "--hook-path", "/usr/bin/nvct",
                 config=node["config"]).returncode == 0
    assert out.read_text().startswith("{")


def test_generate_refuses_a_format_the_extension_contradicts(entry_points, node, tmp_path):
    proc = _nvct(entry_points, "cdi", "generate", "--output", str(tmp_path / "x.json"), "--format", "yaml",
                 config=node["config"])
    assert proc.returncode == 1
    assert proc.stderr == f"nvct: --format yaml does not match --output {tmp_path}/x.json\n"
    assert list(tmp_path.iterdir()) == []


def test_generate_roots_from_the_command_line(entry_points, node, tmp_path):
    root = node["roots"]["driver_root"]
    config = tmp_path / "config.toml"  # only /proc is configured: the driver root comes from --driver-root
    config.write_text(f'[nvct]\nproc-root = "{node["roots"]["proc_root"]}"\n')
    proc = _nvct(entry_points, "cdi", "generate", "--driver-root", root, "--device-id", "0",
                 "--format", "json", "--hook-path", "/usr/bin/nvct", config=str(config))
    assert proc.returncode == 0, proc.stderr
    loaded = spec.parse(proc.stdout, "<stdout>")
    nodes = loaded.devices["0"]["containerEdits"]["deviceNodes"]
    assert nodes[0] == {"path": "/dev/nvidia0", "hostPath": f"{root}/dev/nvidia0", "type": "c",
                        "major": 195, "minor": 0, "fileMode": 0o666}
    mounts = loaded.edits["mounts"]
    assert all(m["hostPath"] == root + m["containerPath"] for m in mounts
               if not m["containerPath"].startswith("/etc/vulkan/"))  # found in /usr/share, put in /etc


def test_generate_errors_are_one_line(entry_points, node):
    proc = _nvct(entry_points, "cdi", "generate", "--device-id", "99", "--hook-path", "/usr/bin/nvct",
                 config=node["config"])
    assert proc.returncode == 1
    assert proc.stderr.startswith("nvct: --device-id: unknown device '99'")
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize("args", [
    ("--hook-path", "/usr/bin/nvct"),
    ("--format=JSON", "--device-id", "0,1", "--device-name-strategy", "uuid", "--no-all-device"),
    ("--vendor", "example.com", "--class=gpu", "--mode", "management"),
    ("--disable-hooks=create-symlinks,update-ldcache", "--enable-hook", "update-ldcache", "--feature-flag",
     "disable-ipc-discoverer", "--ldconfig-path", "/sbin/ldconfig.real", "--devices", "1", "--cdi-class", "x"),
    ("--mode=IMEX", "--nvidia-ctk-path", "/opt/nvidia-ctk", "--device", "all"),
])
def test_generate_without_click_writes_what_the_click_path_writes(entry_points, node, args):
    """A plain command line skips click (~20 ms); ``--debug`` goes through click: same spec."""
    fast = _nvct(entry_points, "cdi", "generate", *args, config=node["config"])
    slow = _nvct(entry_points, "--debug", "cdi", "generate", *args, config=node["config"])
    assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
    assert fast.stdout == slow.stdout


def test_generate_imports_no_click_for_a_plain_command_line(node):
    code = ("import sys; from nvct.cli import main; main(['cdi', 'generate', '--output', sys.argv[1]]);"
            "assert 'click' not in sys.modules and 'elftools' not in sys.modules")
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=node["config"])
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-c", code, os.path.join(d, "nvidia.yaml")], check=True, env=env)


@pytest.mark.parametrize("args, error", [
    (("--format", "toml"), "Invalid value for '--format'"),
    (("--no-such-option",), "No such option: --no-such-option"),
])
def test_generate_leaves_odd_command_lines_to_click(entry_points, node, args, error):
    proc = _nvct(entry_points, "cdi", "generate", *args, config=node["config"])
    assert proc.returncode == 2 and error in proc.stderr


def test_list_prints_qualified_names_and_warns_about_invalid_files(entry_points, tmp_path):
    write_spec(tmp_path / "a", "good.yaml", minimal_spec(name="d1"))
    bad = write_spec(tmp_path / "b", "bad.json", '{"cdiVersion": "0.5.0", "kind": "x"}')
    write_spec(tmp_path / "b", "good.json", minimal_spec(kind="other.io/thing", name="t"))
    proc = _nvct(entry_points, "cdi", "list", "--spec-dir", str(tmp_path / "a"), "--spec-dir", str(tmp_path / "b"))
    assert proc.returncode == 0
    assert proc.stdout == "other.io/thing=t\nvendor.com/device=d1\n"
    assert proc.stderr == f"nvct: warning: {bad}: kind: kind 'x' is not of the form vendor/class\n"


def test_list_reads_the_configured_spec_dirs(entry_points, tmp_path):
    write_spec(tmp_path / "specs", "s.yaml", minimal_spec(name="d9"))
    config = tmp_path / "config.toml"
    config.write_text(f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{tmp_path}/specs"]\n')
    proc = _nvct(entry_points, "cdi", "list", config=str(config))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "vendor.com/device=d9\n", "")


def test_transform_root_from_a_file_to_a_file(entry_points, tmp_path):
    source = minimal_spec("0.4.0", deviceNodes=[{"path": "/dev/nvidia0"}],
                          mounts=[{"hostPath": "/driver/lib/x.so", "containerPath": "/lib/x.so"}])
    src = write_spec(tmp_path, "in.yaml", source)
    proc = _nvct(entry_points, "cdi", "transform", "root", "--from", "/", "--to", "/driver",
                 "--input", src, "--output", str(tmp_path / "out.json"))
    assert (proc.returncode, proc.stderr) == (0, "")
    out = spec.read(str(tmp_path / "out.json"))
    edits = out.devices["dev0"]["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/nvidia0", "hostPath": "/driver/dev/nvidia0"}]
    assert edits["mounts"][0]["hostPath"] == "/driver/driver/lib/x.so"
    assert out.version == "0.5.0"  # hostPath needs 0.5.0: the version follows


def test_transform_root_through_stdin_and_stdout(entry_points):
    source = minimal_spec(mounts=[{"hostPath": "/driver/lib/x.so", "containerPath": "/lib/x.so"}])
    proc = _nvct(entry_points, "cdi", "transform", "root", "--from", "/driver", "--to", "/run/nvidia/driver",
                 stdin=yaml.safe_dump(source))
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["devices"][0]["containerEdits"]["mounts"] == [
        {"hostPath": "/run/nvidia/driver/lib/x.so", "containerPath": "/lib/x.so"}]


def test_transform_root_rejects_an_invalid_input(entry_points, tmp_path):
    src = write_spec(tmp_path, "in.yaml", "cdiVersion: 0.5.0\n")
    proc = _nvct(entry_points, "cdi", "transform", "root", "--from", "/a", "--input", src)
    assert proc.returncode == 1
    assert proc.stderr == f"nvct: {src}: kind is missing\n"
