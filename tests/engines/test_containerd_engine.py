from __future__ import annotations

import itertools
import os
import re
import stat

import pytest

from nvct import engines as runtimes
from nvct.base.errors import ConfigError
from nvct.engines.containerd import PLUGINS
from tests.engines import toml_loads

NVIDIA = "/usr/bin/nvidia-container-runtime"

#: The body of versions 3 and 4 (containerd 2.x: the CRI plugin split in images and runtime).
_CRI_V1 = '''\
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.runtime"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = true  # cgroup driver
'''

#: A realistic config per version: runc is the default, with SystemdCgroup set.
CONFIGS = {
    1: '''\
# containerd 1.x, version 1 layout
[plugins.cri]
  sandbox_image = "registry.k8s.io/pause:3.6"  # pinned
  [plugins.cri.containerd]
    default_runtime_name = "runc"
    [plugins.cri.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.runtimes.runc.options]
        SystemdCgroup = true
''',
    2: '''\
# containerd 1.x
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.6"  # pinned

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
''',
    3: "# containerd 2.x\nversion = 3\n\n" + _CRI_V1,
    4: "# containerd 2.3 (the documented version 4 layout: plugin ids as version 3)\nversion = 4\n\n" + _CRI_V1,
}

MATRIX = [(v, drop_in, default, cdi)
          for v, drop_in, default, cdi in itertools.product((1, 2, 3, 4), (False, True), (False, True), (False, True))]


def _ids(case):
    v, drop_in, default, cdi = case
    return f"v{v}-{'drop-in' if drop_in else 'plain'}{'-default' if default else ''}{'-cdi' if cdi else ''}"


@pytest.mark.parametrize("case", MATRIX, ids=[_ids(c) for c in MATRIX])
def test_configure_then_unconfigure(tmp_path, case):
    version, use_drop_in, set_default, cdi = case
    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    config.write_text(CONFIGS[version])
    plugin = PLUGINS[version]
    kwargs = dict(set_default="nvidia" if set_default else None, cdi=cdi,
                  drop_in=str(drop_in) if use_drop_in else None)

    if version == 1 and use_drop_in:
        with pytest.raises(ConfigError, match="version 1 cannot import drop-in files"):
            runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, **kwargs)
        assert config.read_text() == CONFIGS[1]
        return

    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, **kwargs)

    main_text = config.read_text()
    main = toml_loads(main_text)
    assert main_text.startswith(CONFIGS[version].splitlines()[0] + "\n")  # comments kept
    if use_drop_in:
        effective = toml_loads(drop_in.read_text())
        assert main["imports"] == [f"{tmp_path}/conf.d/*.toml"]
        assert effective["version"] == version
        assert main["plugins"] == toml_loads(CONFIGS[version])["plugins"]  # main's CRI untouched
    else:
        effective = main
        assert not drop_in.exists()
    cri = effective["plugins"][plugin]
    runtimes_table = cri["containerd"]["runtimes"]
    if use_drop_in and version >= 3:  # containerd 2.x merges key by key: the drop-in holds only nvct's keys
        assert list(runtimes_table) == ["nvidia"]
    else:  # containerd 1.x replaces the whole CRI section: the drop-in carries a copy of runc too
        assert runtimes_table["runc"]["options"] == {"SystemdCgroup": True}
    nvidia = runtimes_table["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["SystemdCgroup"] is True
    assert nvidia["options"]["BinaryName"] == NVIDIA
    assert ("Runtime" in nvidia["options"]) == (version == 1)
    only_ours = use_drop_in and version >= 3
    assert cri["containerd"].get("default_runtime_name") == ("nvidia" if set_default else None if only_ours else "runc")
    assert cri.get("enable_cdi", False) is cdi

    runtimes.unconfigure("containerd", str(config))
    assert config.read_text() == CONFIGS[version]
    assert not drop_in.exists() and not drop_in.parent.exists()
    assert sorted(os.listdir(tmp_path)) == ["config.toml"]


@pytest.mark.parametrize("version", [2, 3, 4])
def test_missing_config_gets_version_and_imports(tmp_path, version):
    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=str(drop_in),
                       options=runtimes.Options(config_version=version))
    assert config.read_text() == f'version = {version}\nimports = ["{tmp_path}/conf.d/*.toml"]\n'
    nvidia = toml_loads(drop_in.read_text())["plugins"][PLUGINS[version]]["containerd"]["runtimes"]["nvidia"]
    assert nvidia == {"runtime_type": "io.containerd.runc.v2", "runtime_root": "", "runtime_engine": "",
                      "privileged_without_host_devices": False, "options": {"BinaryName": NVIDIA}}
    runtimes.unconfigure("containerd", str(config))
    assert sorted(os.listdir(tmp_path)) == []


def test_default_drop_in_is_beside_the_config(tmp_path):
    config = tmp_path / "config.toml"
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA})
    assert (tmp_path / "conf.d" / "99-nvidia.toml").is_file()


def test_v1_config_with_the_default_drop_in_is_edited_in_place(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIGS[1])
    change = runtimes.configure("containerd", str(config), {"nvidia": NVIDIA})
    assert any("version 1 config" in n for n in change.notes)
    assert "nvidia" in toml_loads(config.read_text())["plugins"]["cri"]["containerd"]["runtimes"]
    assert not (tmp_path / "conf.d").exists()


def test_existing_import_glob_is_not_repeated(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["/other/*.toml", "{tmp_path}/conf.d/*.toml"]\n')
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=str(tmp_path / "conf.d/99-nvidia.toml"))
    assert toml_loads(config.read_text())["imports"] == ["/other/*.toml", f"{tmp_path}/conf.d/*.toml"]


def test_import_uses_the_host_path_of_the_drop_in(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=str(tmp_path / "conf.d/99-nvidia.toml"),
                       options=runtimes.Options(drop_in_host_path="/etc/containerd/conf.d/99-nvidia.toml"))
    assert toml_loads(config.read_text())["imports"] == ["/etc/containerd/conf.d/*.toml"]


def test_three_runtimes_in_one_transaction_and_one_undo(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIGS[2])
    runtimes.configure("containerd", str(config), {
        "nvidia": NVIDIA, "nvidia-cdi": NVIDIA + ".cdi", "nvidia-legacy": NVIDIA + ".legacy"},
        set_default="nvidia", drop_in=None,
        options=runtimes.Options(container_annotations=["cdi.k8s.io/*"]))
    table = toml_loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert table["default_runtime_name"] == "nvidia"
    assert {n: r["options"]["BinaryName"] for n, r in table["runtimes"].items() if n != "runc"} == {
        "nvidia": NVIDIA, "nvidia-cdi": NVIDIA + ".cdi", "nvidia-legacy": NVIDIA + ".legacy"}
    assert table["runtimes"]["nvidia-cdi"]["container_annotations"] == ["cdi.k8s.io/*"]
    runtimes.unconfigure("containerd", str(config))
    assert config.read_text() == CONFIGS[2]


def test_no_runc_to_copy_from_is_said_once_for_three_runtimes(tmp_path):
    """The installer adds nvidia, nvidia-cdi and nvidia-legacy: one note, not one per runtime."""
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    change = runtimes.configure("containerd", str(config), {
        "nvidia": NVIDIA, "nvidia-cdi": NVIDIA + ".cdi", "nvidia-legacy": NVIDIA + ".legacy"}, drop_in=None,
        dry_run=True)
    assert [n for n in change.notes if "to copy options from" in n] == [
        "no runc, crun runtime to copy options from: using runtime_type 'io.containerd.runc.v2'"]


def test_options_come_from_the_default_runtime_before_runc(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIGS[2].replace('default_runtime_name = "runc"', 'default_runtime_name = "crun"') + '''
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
        BinaryName = "/usr/bin/crun"
        NoPivotRoot = true
''')
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=None)
    nvidia = toml_loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": NVIDIA, "NoPivotRoot": True}


def test_runtime_overrides_are_merged_into_each_runtime(tmp_path):
    config = tmp_path / "config.toml"
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=None,
                       options=runtimes.Options(runtime_overrides={"options": {"SystemdCgroup": True},
                                                                   "pod_annotations": ["a"]}))
    nvidia = toml_loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"BinaryName": NVIDIA, "SystemdCgroup": True}
    assert nvidia["pod_annotations"] == ["a"]


@pytest.mark.parametrize("content,message", [
    ("version = 5\n", "unsupported containerd config version 5 (expected one of 1, 2, 3, 4)"),
    ("version = 0\n", "unsupported containerd config version 0 (expected one of 1, 2, 3, 4)"),
    ('version = "2"\n', "version must be an integer, not '2'"),
    ("version = 2\nversion = 3\n", "invalid TOML: line 2, column .*: duplicate key or table"),
    ("version = 2\n[plugins\n", "invalid TOML: line 2, column "),
    ('version = 2\nimports = "x"\n', "imports is not a list of strings"),
])
def test_bad_config_is_one_error_and_nothing_changes(tmp_path, content, message):
    config = tmp_path / "config.toml"
    config.write_text(content)
    with pytest.raises(ConfigError) as e:
        runtimes.configure("containerd", str(config), {"nvidia": NVIDIA})
    assert re.match(re.escape(f"{config}: ") + message.replace("(", r"\(").replace(")", r"\)"), str(e.value))
    assert "\n" not in str(e.value)
    assert config.read_text() == content
    assert sorted(os.listdir(tmp_path)) == ["config.toml"]


def _fake_containerd(tmp_path, output: str, status: int = 0) -> str:
    script = tmp_path / "containerd"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\ncat <<'EOF'\n{output}EOF\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_command_source_copies_options_from_what_the_daemon_reports(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    dump = CONFIGS[2].replace("SystemdCgroup = true", 'SystemdCgroup = true\n        Root = "/dumped"')
    exe = _fake_containerd(tmp_path, dump)
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=None,
                       config_source="command", executable=exe)
    assert (tmp_path / "argv").read_text().split() == ["--config", str(config), "config", "dump"]
    nvidia = toml_loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"] == {"SystemdCgroup": True, "Root": "/dumped", "BinaryName": NVIDIA}


def test_a_new_config_takes_the_version_the_daemon_reports(tmp_path):
    """No config file on a containerd 2.x node: its dump says version 3, and nvct writes 3, as the reference."""
    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    exe = _fake_containerd(tmp_path, CONFIGS[3])
    runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=str(drop_in),
                       config_source="command", executable=exe)
    assert (tmp_path / "argv").read_text().split() == ["config", "dump"]
    assert config.read_text() == f'version = 3\nimports = ["{tmp_path}/conf.d/*.toml"]\n'
    nvidia = {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True, "BinaryName": NVIDIA}}
    assert toml_loads(drop_in.read_text()) == {"version": 3, "plugins": {PLUGINS[3]: {"containerd": {"runtimes": {
        "nvidia": nvidia}}}}}


def test_failing_command_source_falls_back_to_the_file(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIGS[2])
    exe = _fake_containerd(tmp_path, "", status=3)
    change = runtimes.configure("containerd", str(config), {"nvidia": NVIDIA}, drop_in=None,
                                config_source="command", executable=exe)
    assert any("could not ask containerd for its config" in n and "exit status 3" in n for n in change.notes)
    runtimes_table = toml_loads(config.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes_table["nvidia"]["options"]["SystemdCgroup"] is True


def test_unconfigure_without_record_removes_drop_in_import_and_runtime(tmp_path):
    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    drop_in.parent.mkdir()
    drop_in.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
                       'runtime_type = "io.containerd.runc.v2"\n')
    config.write_text(f'version = 2\nimports = ["{tmp_path}/conf.d/*.toml"]\n')
    runtimes.unconfigure("containerd", str(config), drop_in=str(drop_in))
    assert not drop_in.exists()
    assert config.read_text() == ""


def test_low_level_runtime_paths(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(CONFIGS[2].replace("SystemdCgroup = true", 'BinaryName = "/usr/sbin/runc"'))
    assert runtimes.low_level_runtime_paths("containerd", str(config)) == ["/usr/sbin/runc"]



@pytest.mark.parametrize("version", [3, 4])
def test_doctor_reads_the_runtimes_of_a_containerd_2_config(tmp_path, version):
    from nvct import doctor
    from tests.support.gpu_runs import SHIM

    config = tmp_path / "config.toml"
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    config.write_text(CONFIGS[version])
    runtimes.configure("containerd", str(config), {"nvidia": SHIM}, set_default="nvidia", drop_in=str(drop_in))
    findings = {f.id: f for f in doctor.run(doctor.Options(
        containerd_config=str(config), docker_config=str(tmp_path / "x"), crio_dir=str(tmp_path / "x"),
        cdi_dirs=(), env={})) if f.id.startswith("runtime.containerd")}
    assert findings["runtime.containerd"].status == "ok", findings
    assert str(drop_in) in findings["runtime.containerd"].seen
    assert findings["runtime.containerd-drift"].status == "ok", findings
