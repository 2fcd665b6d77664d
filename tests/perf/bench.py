#!/usr/bin/env python3
"""nvct's benchmark: every figure is a ratio against a baseline measured in the same run.

    sudo .venv/bin/python tests/perf/bench.py [--runs N] [--json FILE]

1. In-process: request + discovery + edits on a simulated node of 8 and 64 GPUs
   (a fresh Driver each time, as in a new shim process).
2. Import time of each entry point (``python -X importtime``), against ``python -c pass``.
3. The shim in passthrough (``--version`` and ``create`` of a non-GPU container) against runc.
4. create -> start -> delete of an 8-GPU container: jit-cdi and legacy against plain runc, no GPU.
5. Start-up of the reference-named programs (``--version``, an unknown hook) against ``nvct hook``
   with an unknown hook, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

PY = sys.executable
BIN = os.path.dirname(PY)
SHIM = os.path.join(BIN, "nvidia-container-runtime")
RUNC = "/usr/sbin/runc"
HEAVY = ("click", "tomlkit", "yaml", "elftools", "nvct.nvml", "ctypes")


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def in_process(node: dict, runs: int) -> float:
    from nvct import config as config_mod, injection, request
    from nvct.driver import Driver

    config = config_mod.load(node["config"])
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}

    def once():
        driver = Driver.from_config(config)
        injection.container_edits(request.from_spec(spec, config), driver, config, hook_path="/usr/bin/nvct")

    once()
    return _median_ms(once, runs)


def import_time(module: str) -> float:
    """Total self+cumulative import time (ms) of ``module``, from -X importtime."""
    out = subprocess.run([PY, "-X", "importtime", "-c", f"import {module}"],
                         capture_output=True, text=True, check=True).stderr
    for line in reversed(out.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1000
    return float("nan")


def heavy_modules_after_passthrough(bundle: str) -> list[str]:
    code = (
        "import os, sys; os.execv = lambda *a: None; sys.argv = [%r];"
        "from nvct.shim import main; main(['create', '--bundle', %r, 'x']);"
        "print(' '.join(m for m in %r if m in sys.modules))" % (SHIM, bundle, HEAVY)
    )
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def _process_ms(argv: list[str], runs: int, env=None) -> float:
    return _median_ms(lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True), runs)


def lifecycles_ms(cases: dict[str, tuple[list[str], str, dict | None]], runs: int) -> dict[str, float]:
    """Median create -> start -> delete per case, the cases interleaved run by run.

    Interleaving matters on a shared machine: runc's own create time drifts by
    tens of ms over a minute, and a drift between phases would read as overhead.
    """
    from tests.support.runtimes import create_start_delete

    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (argv, bundle, env) in cases.items():
            result = create_start_delete(argv, bundle, env=env)
            if result.rc != 0:
                raise SystemExit(f"{name}: container failed: {result.describe()}")
            times[name].append(result.timings["total"] * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def dropin_startup_ms(rootfs: str, runs: int) -> dict[str, float]:
    """Median wall time of each reference-named program, interleaved run by run with the baseline."""
    state = json.dumps({"ociVersion": "1.0", "id": "bench", "pid": 0, "root": rootfs}).encode()
    cases = {
        "nvct_hook_unknown": [os.path.join(BIN, "nvct"), "hook", "no-such-hook"],
        "nvidia_cdi_hook_unknown": [os.path.join(BIN, "nvidia-cdi-hook"), "no-such-hook"],
        "nvidia_cdi_hook_version": [os.path.join(BIN, "nvidia-cdi-hook"), "--version"],
        "nvidia_ctk_hook_unknown": [os.path.join(BIN, "nvidia-ctk"), "hook", "no-such-hook"],
        "nvidia_ctk_version": [os.path.join(BIN, "nvidia-ctk"), "--version"],
        "nvidia_container_cli_version": [os.path.join(BIN, "nvidia-container-cli"), "--version"],
        "nvidia_ctk_installer_version": [os.path.join(BIN, "nvidia-ctk-installer"), "--version"],
        "nvidia_container_runtime_hook_version": [os.path.join(BIN, "nvidia-container-runtime-hook"), "--version"],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, argv in cases.items():
            t = time.perf_counter()
            subprocess.run(argv, input=state, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", help="write the figures here as JSON")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.py needs root (simulated node, containers)")

    from nvct.simulate.node import cached_node
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    work = tempfile.mkdtemp(prefix="nvct-bench-")
    node8 = cached_node(os.path.join(work, "sim"))
    node64 = cached_node(os.path.join(work, "sim"), gpus=64, mig=False)
    figures: dict[str, float] = {}

    figures["inprocess_8gpu_ms"] = in_process(node8, opts.runs * 5)
    figures["inprocess_64gpu_ms"] = in_process(node64, opts.runs * 5)

    baseline_import = _process_ms([PY, "-c", "pass"], opts.runs)
    figures["python_start_ms"] = baseline_import
    for module in ("nvct.shim", "nvct.hook", "nvct.cli", "nvct.hooks"):
        figures[f"import_{module}_ms"] = import_time(module)

    rootfs = make_rootfs(work)
    plain = make_bundle(os.path.join(work, "plain"), rootfs, ["true"])
    figures["heavy_modules_on_passthrough"] = heavy_modules_after_passthrough(plain)

    runc_version = _process_ms([RUNC, "--version"], opts.runs)
    shim_version = _process_ms([SHIM, "--version"], opts.runs)
    figures["runc_version_ms"] = runc_version
    figures["shim_version_ms"] = shim_version
    figures["passthrough_added_ms"] = shim_version - runc_version
    figures["passthrough_ratio"] = shim_version / runc_version

    startup = dropin_startup_ms(rootfs, opts.runs)
    for name, ms in startup.items():
        figures[f"{name}_ms"] = ms
        figures[f"{name}_ratio_to_nvct_hook"] = ms / startup["nvct_hook_unknown"]

    config_text = open(node8["config"]).read()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cases: dict[str, tuple[list[str], str, dict | None]] = {
        "runc_plain": ([RUNC], plain, None),
        "shim_plain": ([SHIM], plain, env),
    }
    for mode in ("jit-cdi", "legacy"):
        cfg = os.path.join(work, f"{mode}.toml")
        with open(cfg, "w") as f:
            f.write(config_text + f'\n[nvidia-container-runtime]\nmode = "{mode}"\n')
        bundle = make_bundle(os.path.join(work, mode), make_rootfs(work, name=f"rootfs-{mode}"),
                             ["true"], env=["NVIDIA_VISIBLE_DEVICES=all"])
        cases[f"{mode}_8gpu"] = ([SHIM], bundle, dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=cfg))
    medians = lifecycles_ms(cases, opts.runs)
    plain_ms = medians["runc_plain"]
    for name, ms in medians.items():
        figures[f"{name}_lifecycle_ms"] = ms
        if name != "runc_plain":
            figures[f"{name}_added_ms"] = ms - plain_ms
            figures[f"{name}_ratio"] = ms / plain_ms

    for key, value in figures.items():
        print(f"{key:40s} {value:.2f}" if isinstance(value, float) else f"{key:40s} {value}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
