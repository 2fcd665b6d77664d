"""500 sequential GPU container lifecycles through the shim and runc leave nothing growing (issue 28).

``tests/perf/lifecycles.py`` does the work (its docstring says what is compared) in a mount
namespace and a /run of its own; ``NVCT_LIFECYCLES`` sets the count (default 500).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.perf import lifecycles
from tests.support.gpu_runs import need_runtime

pytestmark = pytest.mark.containers

COUNT = int(os.environ.get("NVCT_LIFECYCLES", "500"))


def test_sequential_lifecycles_leave_nothing_growing(tmp_path, sim_node):
    need_runtime("runc")
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, lifecycles.__file__, "--count", str(COUNT), "--node-config",
                           sim_node["config"], "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["differences"] == [], figures
    assert figures["count"] == COUNT and figures["run_nvct_files"] > 0 and figures["parse_cache_files"] > 0


def test_growth_is_seen(tmp_path):
    """The comparison itself: a file more in a bundle or a root, an fd more, is a difference."""
    bundle = tmp_path / "bundle"
    (tmp_path / "root-bundle").mkdir()
    bundle.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    before = lifecycles.stock(str(tmp_path), [str(bundle)], str(state))
    (bundle / ".nvct-1234.tmp").write_text("x")
    (tmp_path / "root-bundle" / "left").write_text("x")
    with open(os.devnull) as extra:
        after = lifecycles.stock(str(tmp_path), [str(bundle)], str(state))
    found = lifecycles.differences(before, after)
    assert [line.split(":")[0] for line in found] == ["bundles", "roots", "fds"], found
    assert ".nvct-1234.tmp" in found[0] and "left" in found[1]
    assert extra.closed
