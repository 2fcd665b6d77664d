"""docs/contributing.md's layer table is tests/structure/test_layers.py's LAYERS, in order."""

from __future__ import annotations

import pathlib

from tests.structure.test_layers import LAYERS

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "contributing.md"


def test_the_layer_table_is_the_layer_order() -> None:
    rows = [line.split("|")[1:3] for line in DOC.read_text().splitlines() if line.startswith("| `nvct/")]
    assert [(folder.strip().strip("`")[len("nvct/"):-1], role.strip()) for folder, role in rows] == list(LAYERS)
