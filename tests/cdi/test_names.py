"""Fully-qualified CDI device names."""

from __future__ import annotations

import pytest

from nvct.request import cdinames as names


@pytest.mark.parametrize("name, parts", [
    ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
    ("nvidia.com/gpu=0:1", ("nvidia.com", "gpu", "0:1")),
    ("nvidia.com/gpu.coherent=GPU-1234", ("nvidia.com", "gpu.coherent", "GPU-1234")),
    ("a/b=c=d", None),
    ("nvidia.com/gpu", None),
    ("gpu=0", None),
    ("/dev/nvidia0", None),
    ("nvidia.com/gpu=", None),
    ("nvidia.com/gpu=-0", None),
    ("nvidia.com/gpu/x=0", None),
])
def test_parse_qualified(name, parts):
    if parts is None:
        with pytest.raises(ValueError, match=repr(name)):
            names.parse_qualified(name)
        assert not names.is_qualified(name)
    else:
        assert names.parse_qualified(name) == parts
        assert names.is_qualified(name)


@pytest.mark.parametrize("name, qualified", [
    ("0", "nvidia.com/gpu=0"),
    ("GPU-1234", "nvidia.com/gpu=GPU-1234"),
    ("all", "nvidia.com/gpu=all"),
    ("acme.com/fpga=3", "acme.com/fpga=3"),
])
def test_unqualified_names_get_the_default_kind(name, qualified):
    assert names.qualify(name, "nvidia.com/gpu") == qualified
