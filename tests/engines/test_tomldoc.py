"""TOML config files through tomlkit: comments and layout kept (nvct.engines.tomldoc)."""

from __future__ import annotations

import re

import pytest

from nvct.base.errors import ConfigError
from nvct.engines.document import TomlDocument
from tests.engines import toml_loads

CRI = ("plugins", "io.containerd.grpc.v1.cri")
RUNTIMES = CRI + ("containerd", "runtimes")
INDENTED = """\
# containerd config, indented like `containerd config default`
version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"  # pinned

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true

[grpc]
  address = "/run/containerd/containerd.sock"
"""


def test_toml_new_runtime_table_matches_its_siblings_layout():
    doc = TomlDocument("c.toml", INDENTED.encode())
    entry = doc.get(RUNTIMES + ("runc",))
    entry["options"]["BinaryName"] = "/usr/bin/nvidia-container-runtime"
    doc.set(RUNTIMES + ("nvidia",), entry)
    text = doc.render().decode()
    assert '''\
            SystemdCgroup = true

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            SystemdCgroup = true
            BinaryName = "/usr/bin/nvidia-container-runtime"

[grpc]
''' in text
    assert text.startswith("# containerd config, indented")


def test_toml_changed_value_keeps_its_comment_and_indent():
    doc = TomlDocument("c.toml", INDENTED.encode())
    doc.set(CRI + ("sandbox_image",), "other:1")
    doc.set(CRI + ("enable_cdi",), True)
    text = doc.render().decode()
    assert '    sandbox_image = "other:1"  # pinned\n    enable_cdi = true\n' in text


def test_toml_scalar_added_to_an_implicit_table_gets_a_header():
    raw = b'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\ndefault_runtime_name = "runc"\n'
    doc = TomlDocument("c.toml", raw)
    doc.set(CRI + ("enable_cdi",), True)
    assert toml_loads(doc.render().decode())["plugins"]["io.containerd.grpc.v1.cri"] == {
        "enable_cdi": True, "containerd": {"default_runtime_name": "runc"}}


def test_toml_new_file_is_flat_with_blank_lines_between_tables():
    doc = TomlDocument("c.toml", None)
    doc.set(("version",), 2)
    doc.set(RUNTIMES + ("nvidia",), {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/x"}})
    doc.set(CRI + ("containerd", "default_runtime_name"), "nvidia")
    assert doc.render().decode() == '''\
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd]
default_runtime_name = "nvidia"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
BinaryName = "/x"
'''


def test_toml_undo_of_own_edits_is_byte_identical():
    doc = TomlDocument("c.toml", INDENTED.encode())
    doc.set(RUNTIMES + ("nvidia",), {"runtime_type": "x", "options": {"BinaryName": "/x"}})
    doc.set(CRI + ("containerd", "default_runtime_name"), "nvidia")
    doc.set(CRI + ("enable_cdi",), True)
    again = TomlDocument("c.toml", doc.render())
    assert again.undo(doc.edits) == []
    assert again.render() == INDENTED.encode()


def test_toml_without_trailing_newline_gets_one_when_edited():
    doc = TomlDocument("c.toml", b"version = 2")
    doc.set(("imports",), ["/etc/containerd/conf.d/*.toml"])
    assert doc.render() == b'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'


@pytest.mark.parametrize("raw,pattern", [
    (b"a = 1\na = 2\n", r"line 2, column \d+: duplicate key or table"),
    (b"[x]\n[x]\n", r"line 2, column \d+: duplicate key or table"),
    (b"a = \n", r"line 1, column \d+: \S.*"),
])
def test_toml_errors_are_one_line_with_line_and_column(raw, pattern):
    with pytest.raises(ConfigError) as e:
        TomlDocument("c.toml", raw)
    assert re.fullmatch(r"c\.toml: invalid TOML: " + pattern, str(e.value)), str(e.value)


def test_toml_render_falls_back_to_plain_output_if_tomlkit_would_get_it_wrong(monkeypatch):
    import nvct.engines.tomldoc as tomldoc

    doc = TomlDocument("c.toml", b"# comment\na = 1\n")
    doc.set(("b",), 2)
    monkeypatch.setattr(tomldoc, "_parses_to", lambda text, want: False)
    assert toml_loads(doc.render().decode()) == {"a": 1, "b": 2}
