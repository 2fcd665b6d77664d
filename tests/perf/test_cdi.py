"""Wall-clock bounds of CDI spec generation, as an operator's fresh ``nvct cdi generate``."""

from __future__ import annotations

import time

from nvct.cdi import spec
from tests.cdi.conftest import entry_points, mig_node, sim_base  # noqa: F401 (fixtures)
from tests.cdi.test_cli import _nvct

#: nvct cdi generate for 8 GPUs with 56 MIG devices, as a new process, on the simulated node.
GENERATE_BUDGET_S = 0.3


def test_generate_for_8_gpus_with_mig_is_fast(entry_points, mig_node, tmp_path):
    out = str(tmp_path / "nvidia.yaml")
    timings = []
    for _ in range(5):
        start = time.monotonic()
        proc = _nvct(entry_points, "cdi", "generate", "--output", out, "--hook-path", "/usr/bin/nvct",
                     config=mig_node["config"])
        timings.append(time.monotonic() - start)
        assert proc.returncode == 0, proc.stderr
    assert len(spec.read(out).devices) == 2 * (8 + 56) + 1
    assert min(timings) < GENERATE_BUDGET_S, f"nvct cdi generate took {min(timings) * 1000:.0f} ms"
