from __future__ import annotations

import json
import re
from tests.engines import toml_loads

import pytest

from nvct.base.errors import ConfigError
from nvct.engines.document import MISSING, Edit, JsonDocument, TomlDocument, same

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


def test_same_tells_booleans_from_integers_and_ignores_dict_order():
    assert same({"a": 1, "b": [True]}, {"b": [True], "a": 1})
    assert not same(True, 1)
    assert not same({"a": 1}, {"a": 1.5})
    assert not same(MISSING, None)


def test_json_keeps_key_order_and_indent_of_the_original():
    raw = b'{\n\t"b": 1,\n\t"a": {"x": true}\n}\n'
    doc = JsonDocument("d.json", raw)
    doc.set(("a", "y"), False)
    doc.set(("c",), "new")
    assert doc.render() == b'{\n\t"b": 1,\n\t"a": {\n\t\t"x": true,\n\t\t"y": false\n\t},\n\t"c": "new"\n}\n'


def test_json_without_nested_lines_uses_the_default_indent():
    doc = JsonDocument("d.json", b'{"a": 1}')
    doc.set(("b",), [1])
    assert doc.render() == b'{\n    "a": 1,\n    "b": [\n        1\n    ]\n}'


def test_json_unchanged_document_renders_the_original_bytes():
    raw = b'{ "a":1 }'
    assert JsonDocument("d.json", raw).render() == raw


@pytest.mark.parametrize("raw,message", [
    (b'{"a": 1,\n "b": }', "d.json: invalid JSON: line 2, column 7: Expecting value"),
    (b'[1, 2]', "d.json: not a JSON object (top level is a JSON array)"),
    (b'{"a": 1, "a": 2}', "d.json: invalid JSON: duplicate key 'a'"),
    (b'{"a": "\xff"}', "d.json: not valid UTF-8 at byte 7"),
])
def test_json_errors_are_one_line_naming_the_file(raw, message):
    with pytest.raises(ConfigError) as e:
        JsonDocument("d.json", raw)
    assert str(e.value) == message


def test_set_records_created_parents_and_the_previous_value():
    doc = JsonDocument("d.json", b'{"default-runtime": "runc"}')
    doc.set(("runtimes", "nvidia"), {"path": "/x"})
    doc.set(("default-runtime",), "nvidia")
    assert doc.edits == [
        Edit(("runtimes",), MISSING, {}),
        Edit(("runtimes", "nvidia"), MISSING, {"path": "/x"}),
        Edit(("default-runtime",), "runc", "nvidia"),
    ]


def test_setting_the_same_value_records_nothing():
    doc = JsonDocument("d.json", b'{"a": true}')
    doc.set(("a",), True)
    assert doc.edits == []


def test_setting_under_a_non_table_is_an_error():
    doc = JsonDocument("d.json", b'{"runtimes": "nope"}')
    with pytest.raises(ConfigError, match=r"^d.json: runtimes is not a table$"):
        doc.set(("runtimes", "nvidia"), {})


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


def test_undo_leaves_alone_what_someone_changed_since():
    doc = JsonDocument("d.json", b'{"default-runtime": "runc"}')
    doc.set(("default-runtime",), "nvidia")
    doc.set(("runtimes", "nvidia"), {"path": "/x"})
    edited = json.loads(doc.render())
    edited["default-runtime"] = "crun"
    again = JsonDocument("d.json", json.dumps(edited).encode())
    assert again.undo(doc.edits) == ["default-runtime"]
    assert again.data() == {"default-runtime": "crun"}


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
    import nvct.engines.document as document

    doc = TomlDocument("c.toml", b"# comment\na = 1\n")
    doc.set(("b",), 2)
    monkeypatch.setattr(document, "_parses_to", lambda text, want: False)
    assert toml_loads(doc.render().decode()) == {"a": 1, "b": 2}
