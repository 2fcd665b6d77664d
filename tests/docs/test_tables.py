"""A Markdown table ends at a blank line: rows after one render without a header."""

from __future__ import annotations

import glob
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, REPO))
def test_no_table_is_split_by_a_blank_line(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    split = [i + 1 for i in range(1, len(lines) - 1)
             if not lines[i].strip() and lines[i - 1].startswith("|") and lines[i + 1].startswith("|")]
    assert split == [], f"{os.path.relpath(path, REPO)}: blank line(s) {split} inside a table"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, REPO))
def test_every_table_starts_with_a_header(path):
    """A row that follows other text (a list, a paragraph) starts a new table: it must be a header."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    inside_code = False
    headless = []
    for i, line in enumerate(lines):
        if line.startswith("```"):
            inside_code = not inside_code
        if inside_code or not line.startswith("|") or (i and lines[i - 1].startswith("|")):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not following.replace(" ", "").startswith("|--") and not following.replace(" ", "").startswith("|:-"):
            headless.append(i + 1)
    assert headless == [], f"{os.path.relpath(path, REPO)}: table row(s) without a header at line(s) {headless}"
