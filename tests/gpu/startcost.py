"""Start cost on a real GPU node: plain runc against the shim in each mode, interleaved.

    NVCT_RUNC=/usr/sbin/runc python tests/gpu/startcost.py [ROUNDS]

Each round takes a container running ``true`` through create, start and
delete, as engines do, once plainly and once per mode asking for every GPU
(utility, compute), in a shuffled order; it prints each case's median wall
time and its ratio to plain runc.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.gpu import test_real_gpu as real


def _bundle(work: Path, name: str, gpu: bool, runc: str, mode: str = "") -> tuple[list[str], dict]:
    bundle = work / name
    bundle.mkdir()
    rootfs = real._rootfs(bundle)
    subprocess.run(["cc", "-static", "-O2", "-o", str(rootfs / "bin/true"), "-x", "c", "-"],
                   input="int main(void) { return 0; }\n", text=True, check=True)
    subprocess.run([runc, "spec", "--bundle", str(bundle)], check=True)
    spec = json.loads((bundle / "config.json").read_text())
    env = ["PATH=/bin"] + (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility,compute"] if gpu else [])
    spec["process"].update(terminal=False, args=["/bin/true"], env=env)
    spec["root"] = {"path": str(rootfs), "readonly": False}
    (bundle / "config.json").write_text(json.dumps(spec))
    if not gpu:
        return [runc, "create", "--bundle", str(bundle)], {"PATH": os.environ["PATH"]}
    config = real._config(bundle, mode, runc)
    return ([os.path.join(real.BIN, "nvidia-container-runtime"), "create", "--bundle", str(bundle)],
            {"PATH": os.environ["PATH"], "NVIDIA_CTK_CONFIG_FILE_PATH": str(config)})


def main(rounds: int) -> None:
    runc = os.environ.get("NVCT_RUNC") or shutil.which("runc") or "runc"
    work = Path(tempfile.mkdtemp(prefix="startcost-"))
    cases = {"runc": _bundle(work, "runc", False, runc)}
    for mode in real.MODES:
        cases[mode] = _bundle(work, mode, True, runc, mode)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for n in range(rounds + 1):
        order = list(cases)
        random.shuffle(order)
        for name in order:
            argv, env = cases[name]
            container = f"c{n}-{name}"
            start = time.perf_counter()
            # The container's init keeps create's stdio: no pipes, or create's caller waits for its end.
            subprocess.run([*argv, container], env=env, check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run([runc, "start", container], check=True, capture_output=True)
            subprocess.run([runc, "delete", "--force", container], check=True, capture_output=True)
            if n:  # round 0 warms the caches
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["runc"])
    for name, values in times.items():
        ms = statistics.median(values) * 1000
        print(f"{name:8} {ms:7.1f} ms  {statistics.median(values) / base:5.2f}x runc  ({len(values)} runs)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
