"""Real-GPU smoke tests: collected only with NVCT_GPU_TESTS=1, on a node with an NVIDIA driver.

CI has no GPU and skips nothing, so these are not part of its run:

    NVCT_GPU_TESTS=1 .venv/bin/python -m pytest tests/gpu -v
"""

import os

collect_ignore_glob = [] if os.environ.get("NVCT_GPU_TESTS") == "1" else ["test_*.py"]
