"""Record, the value class of the container-start path, and the rule of which style goes where."""

from __future__ import annotations

import ast
import pathlib

import pytest

from nvct.base.record import Record

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nvct"

#: The packages a container start imports (the shim, the hooks, nvidia-container-cli's configure):
#: their value classes are Records; dataclasses (~7 ms of imports) and namedtuple (collections,
#: an exec per class) stay off it. Everything else uses frozen dataclasses (docs/contributing.md).
HOT = ("base", "config", "linux", "oci", "discover", "node", "request", "edits", "rootfs", "hooks", "cdi",
       "modifier", "programs")


class Point(Record):
    __slots__ = ("x", "y", "reason")
    _defaults = {"y": 0, "reason": ""}


def test_fields_by_position_or_name_with_defaults():
    assert Point(1, 2).as_dict() == {"x": 1, "y": 2, "reason": ""}
    assert Point(x=1) == Point(1, 0)
    assert repr(Point(1, reason="why")) == "Point(x=1, y=0, reason='why')"


@pytest.mark.parametrize("args, kwargs, message", [
    ((), {}, "missing argument 'x'"),
    ((1, 2, "", 4), {}, "takes at most 3 arguments"),
    ((1,), {"x": 2}, "unexpected or repeated argument 'x'"),
    ((1,), {"z": 2}, "unexpected or repeated argument 'z'"),
])
def test_bad_arguments_are_named(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        Point(*args, **kwargs)


def test_immutable_and_replace_gives_a_copy():
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="immutable"):
        p.x = 3
    with pytest.raises(AttributeError, match="immutable"):
        del p.x
    assert p.replace(y=5) == Point(1, 5) and p == Point(1, 2)


def test_reason_takes_no_part_in_equality_or_hashing():
    assert Point(1, reason="a") == Point(1, reason="b")
    assert len({Point(1, reason="a"), Point(1, reason="b"), Point(2)}) == 2
    assert Point(1) != (1, 0) and Point(1) != _Other(1)


class _Other(Record):
    __slots__ = ("x", "y", "reason")
    _defaults = {"y": 0, "reason": ""}


def _value_class_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module in ("dataclasses", "collections", "typing"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if node.module == "dataclasses" or a.name in ("namedtuple", "NamedTuple")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "dataclasses"]
        elif isinstance(node, ast.Attribute) and node.attr in ("namedtuple", "NamedTuple", "dataclass"):
            found.append(ast.unparse(node))
    return found


def test_container_start_packages_build_value_classes_as_records():
    found = [f"{p.relative_to(ROOT.parent)}: {name}"
             for package in HOT for p in sorted((ROOT / package).rglob("*.py"))
             for name in _value_class_imports(p)]
    assert found == []


def test_other_packages_use_dataclasses_not_records_or_namedtuples():
    others = [p for p in sorted(ROOT.iterdir()) if p.is_dir() and p.name not in HOT and p.name != "__pycache__"]
    assert {p.name for p in others} >= {"engines", "toolkit", "doctor", "simulate", "cli"}
    found = []
    for package in others:
        for p in sorted(package.rglob("*.py")):
            found += [f"{p.relative_to(ROOT.parent)}: {n}" for n in _value_class_imports(p) if "dataclass" not in n]
            if "nvct.base.record" in p.read_text():
                found.append(f"{p.relative_to(ROOT.parent)}: Record")
    assert found == []
