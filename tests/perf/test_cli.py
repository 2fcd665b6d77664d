"""Wall-clock bounds of the command line: ``nvct explain`` as an operator runs it."""

from __future__ import annotations

import time

from tests.cli.test_explain_cli import _explain, bins, node  # noqa: F401 (fixtures)


def test_explain_runs_in_under_a_second(node, bins):
    """A fresh process each time, as an operator runs it; the best of three."""
    times = []
    for _ in range(3):
        start = time.monotonic()
        shown = _explain(bins, node.config, "-e", "NVIDIA_VISIBLE_DEVICES=all", "--json", "--diff")
        times.append(time.monotonic() - start)
        assert shown.returncode == 0, shown.stderr
    assert min(times) < 1.0, times
