#!/usr/bin/env python3
"""Sequential GPU container lifecycles through the shim and runc: does anything grow? (issue 28)

    sudo .venv/bin/python tests/perf/lifecycles.py [--count 500] [--json FILE]

``--count`` create -> start -> delete lifecycles of GPU containers, one after the
other, the modes taken in turn (legacy, jit-cdi, cdi; one bundle and root each,
reused, each create from the engine's pristine config.json, as a restarted
container gets it). The loop runs in a private mount namespace with a /run of
its own (tmpfs), so /run/nvct holds only what these starts wrote, whatever else
runs on the machine. After a warm-up round and again at the end it takes stock:

* every file under /run/nvct (records, names, kept configs, the parse caches), by name and size;
* every entry in the bundles and their roots, by name and size, and runc's state dir;
* this process's open fds; the mounts of the namespace; processes left (our children,
  or any process running from the work dir);
* the time per start: after each round of the modes, a plain runc lifecycle (no shim, no GPU) of a
  bundle of its own, so each round gives a ratio to plain runc measured beside it (a shared machine's
  load moves wall times by 2x over minutes; the ratio does not).

Nothing may differ between the two stock-takings, and the last quarter's median ratio may not be
much above the first quarter's. ``tests/perf/test_lifecycles.py`` runs it in CI.
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
MODES = ("legacy", "jit-cdi", "cdi")
#: The container checks its GPU: the library loads, the device node is there.
COMMAND = "dlopen-probe libcuda.so.1 && test -c /dev/nvidia0"
#: Above this, the last quarter's median ratio to plain runc counts as slower than the first quarter's.
SLOWER = 1.5


def private_argv(argv: list[str]) -> list[str]:
    """``argv`` in a new mount namespace (private propagation) with a tmpfs on /run."""
    return ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
            'mount -t tmpfs -o mode=0755 nvct-lifecycles /run && exec "$@"', "-", *argv]


def _tree(top: str) -> dict[str, int]:
    """Every entry below ``top``, without following links: relative path -> size (-1: a directory)."""
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            out[os.path.relpath(path, top)] = -1 if name in dirnames else st.st_size
    return out


def _processes(work: str) -> list[str]:
    """Processes that are our children or run from ``work`` (cwd, exe or argv)."""
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if int(pid) != me and (ppid == me or cwd.startswith(work) or work in cmdline):
            found.append(f"{pid}: {cmdline}")
    return found


def stock(work: str, bundles: list[str], state: str) -> dict:
    """What the starts may have left: see the module's docstring."""
    with open("/proc/self/mountinfo") as f:
        mounts = sorted(line.split()[4] for line in f)
    run = _tree("/run/nvct") if os.path.isdir("/run/nvct") else {}
    return {
        "run_nvct": run,
        "parse_caches": {k: v for k, v in run.items() if k.split("/")[0].endswith("-cache")},
        "bundles": {b: _tree(b) for b in bundles},
        "roots": {b: _tree(os.path.join(work, "root-" + os.path.basename(b))) for b in bundles},
        "runc_state": sorted(os.listdir(state)),
        "fds": sorted(os.listdir("/proc/self/fd")),
        "mounts": mounts,
        "processes": _processes(work),
    }


def differences(before: dict, after: dict) -> list[str]:
    """One line per thing that changed between two stock-takings (fds: the count)."""
    out = []
    for key in before:
        if key == "fds":
            if len(after[key]) != len(before[key]):
                out.append(f"fds: {len(before[key])} -> {len(after[key])}")
        elif key == "processes":
            out += [f"process left: {p}" for p in after[key]]
        elif after[key] != before[key]:
            out.append(f"{key}: {_diff(before[key], after[key])}")
    return out


def _diff(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        changed = [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b))
                   if a.get(k) != b.get(k) and not isinstance(a.get(k), dict)]
        nested = [f"{k}: {_diff(a[k], b[k])}" for k in sorted(set(a) & set(b))
                  if isinstance(a[k], dict) and a[k] != b[k]]
        return "; ".join((changed + nested)[:10])
    return f"{a!r} -> {b!r}"[:500]


def _config(work: str, node_config: str, mode: str, runc: str, spec_dir: str) -> str:
    """The node's config for ``mode`` (no debug log: legacy mode's sh front appends its hook then)."""
    with open(node_config) as f:
        text = f.read()
    text += f'\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runc}"]\n'
    if mode == "cdi":
        text += f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir}"]\n'
    path = os.path.join(work, f"{mode}.toml")
    with open(path, "w") as f:
        f.write(text)
    os.utime(path, (time.time() - 60,) * 2)  # old enough to be recorded at once (nvct.oci.runtime.identity)
    return path


def run(count: int, node_config: str, work: str) -> dict:
    """``count`` lifecycles in turn over :data:`MODES`; the stock before (after one warm-up round)
    and after, each lifecycle's milliseconds, and the differences."""
    sys.path.insert(0, REPO)
    from tests.support.bundle import make_bundle, read_config, write_config
    from tests.support.gpu_runs import NVCT, PATH_ENV, SHIM
    from tests.support.rootfs import make_rootfs
    from tests.support.runtimes import RUNC, create_start_delete

    spec_dir = os.path.join(work, "cdi")
    os.makedirs(spec_dir)
    subprocess.run([NVCT, "cdi", "generate", "--hook-path", NVCT, "--output", os.path.join(spec_dir, "nvidia.yaml")],
                   env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": node_config},
                   check=True, capture_output=True)
    state = os.path.join(work, "runc-state")
    os.makedirs(state)
    cases = []
    for mode in MODES:
        bundle = os.path.join(work, f"bundle-{mode}")
        make_bundle(bundle, make_rootfs(work, name=f"root-bundle-{mode}"), ["sh", "-c", COMMAND],
                    env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
               "NVIDIA_CTK_CONFIG_FILE_PATH": _config(work, node_config, mode, RUNC, spec_dir)}
        cases.append((mode, bundle, read_config(bundle), env))
    bundles = [bundle for _, bundle, _, _ in cases]
    plain = make_bundle(os.path.join(work, "bundle-plain"), make_rootfs(work, name="root-bundle-plain"), ["true"])
    plain_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}

    def lifecycle(i: int, argv: list[str], bundle: str, env: dict, what: str) -> float:
        result = create_start_delete(argv, bundle, f"life-{i}-{what}", root=state, env=env, timeout=60)
        if not result.ok:
            raise SystemExit(f"lifecycle {i} ({what}) failed: {result.describe()}")
        return result.timings["total"] * 1000

    def round_ratio(first: int, n: int) -> float:
        """``n`` GPU lifecycles from number ``first``, then a plain runc one: their mean over it."""
        gpu = []
        for i in range(first, first + n):
            mode, bundle, spec, env = cases[i % len(cases)]
            write_config(bundle, spec)  # the engine's spec, as every create gets it
            gpu.append(lifecycle(i, [SHIM], bundle, env, mode))
        return statistics.mean(gpu) / lifecycle(first, [RUNC], plain, plain_env, "plain")

    warm = len(cases)
    round_ratio(0, warm)
    before = stock(work, bundles, state)
    ratios = [round_ratio(i, min(warm, warm + count - i)) for i in range(warm, warm + count, warm)]
    after = stock(work, bundles, state)
    quarter = max(len(ratios) // 4, 1)
    first, last = statistics.median(ratios[:quarter]), statistics.median(ratios[-quarter:])
    found = differences(before, after)
    if last > SLOWER * first:
        found.append(f"time per lifecycle: ratio to plain runc {first:.2f} in the first quarter, {last:.2f} in "
                     "the last")
    return {"count": count, "first_quarter_ratio": first, "last_quarter_ratio": last,
            "run_nvct_files": len(after["run_nvct"]), "parse_cache_files": len(after["parse_caches"]),
            "fds": len(after["fds"]), "mounts": len(after["mounts"]), "differences": found,
            "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--node-config", help="a simulated node's config.toml (default: build one)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)  # already in the namespace
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("lifecycles.py needs root (simulated node, containers, a mount namespace)")
    if not opts.inside:
        argv = [sys.executable, os.path.abspath(__file__), "--inside", "--count", str(opts.count)]
        argv += ["--node-config", opts.node_config] if opts.node_config else []
        argv += ["--json", opts.json] if opts.json else []
        os.execvp("unshare", private_argv(argv))
    with tempfile.TemporaryDirectory(prefix="nvct-lifecycles-") as work:
        node_config = opts.node_config
        if not node_config:
            sys.path.insert(0, REPO)
            from nvct.simulate.node import cached_node

            node_config = cached_node(os.path.join(work, "sim"))["config"]
        t = time.monotonic()
        figures = run(opts.count, node_config, work)
        figures["wall_s"] = time.monotonic() - t
    print(json.dumps(figures, indent=2))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(figures, f, indent=2)
    sys.exit(1 if figures["differences"] else 0)


if __name__ == "__main__":
    main()
