#!/usr/bin/env python3
"""nvct's benchmark: every figure is a ratio against a baseline measured in the same run.

    sudo .venv/bin/python tests/perf/bench.py [--runs N] [--json FILE]

1. In-process: request + discovery + edits on a simulated node of 8 and 64 GPUs
   (a fresh Driver each time, as in a new shim process).
2. Import time of each entry point (``python -X importtime``), against ``python -c pass``.
3. The shim in passthrough (``--version`` and ``create`` of a non-GPU container) against runc.
4. create -> start -> delete through the shim against plain runc, interleaved: no GPU (no config
   file, nvct's shipped config, the reference's default config); jit-cdi,
   legacy and cdi mode (a YAML spec) on 8 GPUs; jit-cdi and cdi mode on 64 GPUs; the hook as
   docker --gpus runs it (a prestart hook in a plain spec, plain runc) on 8 GPUs. Every run
   starts from the pristine config.json and /etc/ld.so.cache, as a fresh container would.
5. ``nvct cdi generate`` for 8 and 64 GPUs as fresh processes, interleaved with ``python -I -c pass``.
6. podman with the packaged hooks.d hook (hooks/oci-nvidia-hook.json, our program) against podman
   without it, for a container without a GPU (the node's config, and nvct's shipped config); also the
   hook forced through Python, for scale.
7. Start-up of the reference-named programs (``--version``, an unknown hook) against ``nvct hook``
   with an unknown hook, interleaved.

8. Concurrent batches of 8, 16 and 32 lifecycles (a bundle and root each; plain runc, no GPU under
   nvct's shipped config, one GPU each in jit-cdi, legacy and cdi mode), interleaved round by round
   with the same batch of plain runc; and the /run/nvct writers' flock with 32 shims at once.

``--quick`` runs only 4-6 and 8 (the figures of the README's performance section); ``--batches``
only 8. ``--cases`` runs only those of 4, with ``--other`` (another install's programs, e.g. the
tree before a change) and ``--reference`` (NVIDIA's rebuilt programs) as further cases of the same
interleaved run (docs/performance.md, "Before and after the layered tree").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
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
HEAVY = ("click", "tomlkit", "yaml", "elftools", "nvct.discover.nvml", "ctypes")


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def in_process(node: dict, runs: int) -> float:
    from nvct.config import file as config_mod
    from nvct.discover.driver import Driver
    from nvct.edits import build as injection
    from nvct.request import container as request

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
        "import os, sys; os.execve = lambda *a: None; sys.argv = [%r];"
        "from nvct.programs.shim import main; main(['create', '--bundle', %r, 'x']);"
        "print(' '.join(m for m in %r if m in sys.modules))" % (SHIM, bundle, HEAVY)
    )
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def _process_ms(argv: list[str], runs: int, env=None) -> float:
    return _median_ms(lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True), runs)


class Case:
    """One create -> start -> delete: the runtime argv, the bundle and its env.

    The pristine config.json and /etc/ld.so.cache are put back before each
    run (untimed): the shim rewrites the spec and the hook the cache, and a
    second run on their output would measure neither.
    """

    def __init__(self, argv: list[str], bundle: str, env: dict | None = None):
        self.argv, self.bundle, self.env = argv, bundle, env
        self._saved = {}
        with open(os.path.join(bundle, "config.json")) as f:
            self.rootfs = os.path.join(bundle, json.load(f)["root"]["path"])
        for path in (os.path.join(bundle, "config.json"), os.path.join(self.rootfs, "etc/ld.so.cache")):
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                self._saved[path] = f.read()

    def reset(self) -> None:
        for path, data in self._saved.items():
            with open(path, "wb") as f:
                f.write(data)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.rootfs, "etc/ld.so.conf.d/00-nvct-driver.conf"))


def lifecycles_ms(cases: dict[str, Case], runs: int, cpu: dict[str, float] | None = None) -> dict[str, float]:
    """Median create -> start -> delete per case, the cases interleaved run by run; with ``cpu``,
    also the median CPU time of all its processes (ours reaped as children or, being the subreaper,
    as orphans) there: on a loaded machine wall time grows with the CPU a start needs, and this
    shows that need directly.

    Interleaving matters on a shared machine: runc's own create time drifts by
    tens of ms over a minute, and a drift between phases would read as overhead.
    The order within a round is shuffled (seeded): a case that always follows
    another would carry what that one leaves (the page cache, runc's cgroup
    cleanup) as its own.
    """
    import random
    import resource

    from tests.support.runtimes import create_start_delete

    times: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    order, rng = list(cases), random.Random(28)
    for _ in range(runs):
        rng.shuffle(order)
        for name in order:
            case = cases[name]
            case.reset()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            result = create_start_delete(case.argv, case.bundle, env=case.env)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if result.rc != 0:
                raise SystemExit(f"{name}: container failed: {result.describe()}")
            times[name].append(result.timings["total"] * 1000)
            cpus[name].append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    for case in cases.values():
        case.reset()
    if cpu is not None:
        cpu.update({name: statistics.median(values) for name, values in cpus.items()})
    return {name: statistics.median(values) for name, values in times.items()}


def interleaved_ms(cases: dict[str, tuple[list[str], dict | None]], runs: int) -> dict[str, float]:
    """Median wall time of each command (stdout discarded), interleaved run by run."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (argv, env) in cases.items():
            t = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True)
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def _mkdir(path: str) -> str:
    os.makedirs(path)
    return path


def podman_hooks_ms(work: str, config: str, runs: int) -> dict[str, float]:
    """``podman run --rm IMAGE true`` (runc) without hooks, with the hooks.d hook, and the hook via Python."""
    from tests.support.image import build_image_tar
    from tests.support.podman import Podman, packaged_hooks_dir
    from tests.support.rootfs import base_rootfs

    image = os.path.join(work, "image.tar")
    build_image_tar(base_rootfs(), image, "nvct/busybox", "latest")
    dirs = {}
    hook = os.path.join(BIN, "nvidia-container-runtime-hook")
    shipped = default_configs(_mkdir(os.path.join(work, "hooksd-configs")))["shipped"]
    for name, args, cfg in (("hooksd_sh_front", None, config), ("hooksd_python", [PY, "-I", hook, "prestart"], config),
                            ("hooksd_sh_front_shipped_config", None, shipped)):
        d = packaged_hooks_dir(_mkdir(os.path.join(work, name)), hook, cfg)
        if args:  # the same program through Python: what every start cost before the sh front
            entry_path = os.path.join(d, "oci-nvidia-hook.json")
            with open(entry_path) as f:
                entry = json.load(f)
            entry["hook"].update(path=PY, args=args)
            with open(entry_path, "w") as f:
                json.dump(entry, f)
        dirs[name] = d
    empty = _mkdir(os.path.join(work, "no-hooks"))
    podmen = {"podman_plain": Podman(runtime=RUNC, hooks_dirs=[empty])}
    podmen.update({name: Podman(runtime=RUNC, hooks_dirs=[d]) for name, d in dirs.items()})
    try:
        for p in podmen.values():
            p.load(image)
            p.run(["--rm", "docker.io/nvct/busybox:latest", "true"]).check()
        times: dict[str, list[float]] = {name: [] for name in podmen}
        for _ in range(runs):
            for name, p in podmen.items():
                t = time.perf_counter()
                p.run(["--rm", "docker.io/nvct/busybox:latest", "true"]).check()
                times[name].append((time.perf_counter() - t) * 1000)
    finally:
        for p in podmen.values():
            p.stop()
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
    sealed = {"PATH": "/usr/bin:/bin"}  # a hook's env is sealed: no PYTHON* from ours
    return startup_ms({name: (argv, sealed) for name, argv in cases.items()}, runs, state)


def startup_ms(cases: dict[str, tuple[list[str], dict | None]], runs: int, stdin: bytes) -> dict[str, float]:
    """Median wall time of each program given ``stdin`` (a hook's state), interleaved run by run."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (argv, env) in cases.items():
            t = time.perf_counter()
            subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           check=True)
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


#: The toolkit installs benchmarked: name -> ``--python``.
TOOLKITS = {"toolkit_bundled": "bundled", "toolkit_host_python": "/usr/bin/python3"}


def install_toolkits(node: dict, work: str) -> dict[str, str]:
    """``nvct toolkit install`` for ``node`` (jit-cdi, runc) once per :data:`TOOLKITS`; name -> toolkit dir."""
    roots = node["roots"]
    out = {}
    for name, python in TOOLKITS.items():
        install_dir = os.path.join(work, name)
        subprocess.run([os.path.join(BIN, "nvct"), "toolkit", "install", "--toolkit-install-dir", install_dir,
                        "--no-daemon", "--no-runtime-config", "--host-root", "/", "--python", python,
                        "--pid-file", os.path.join(work, f"{name}.pid"), "--driver-root", roots["driver_root"],
                        "--dev-root", roots["dev_root"], "--proc-root", roots["proc_root"],
                        "--nvidia-container-runtime.mode", "jit-cdi", "--nvidia-container-runtime.runtimes", RUNC],
                       check=True, stderr=subprocess.DEVNULL)
        out[name] = os.path.join(install_dir, "toolkit")
    return out


def installed_startup_ms(toolkits: dict[str, str], rootfs: str, runs: int) -> dict[str, float]:
    """Start-up of the shim (``--version``), the legacy hook and ``nvct hook``: deb and toolkits, interleaved."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    dirs = {"deb": BIN, **toolkits}
    cases = {}
    for name, d in dirs.items():
        cases[f"{name}_shim_version"] = ([os.path.join(d, "nvidia-container-runtime"), "--version"], env)
        cases[f"{name}_hook_version"] = ([os.path.join(d, "nvidia-container-runtime-hook"), "--version"], env)
        cases[f"{name}_nvct_hook_unknown"] = ([os.path.join(d, "nvct"), "hook", "no-such-hook"], env)
    state = json.dumps({"ociVersion": "1.0", "id": "bench", "pid": 0, "root": rootfs}).encode()
    return startup_ms(cases, runs, state)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="only the container, generate and podman figures")
    parser.add_argument("--json", help="write the figures here as JSON")
    parser.add_argument("--batches", action="store_true", help="only the concurrent batches and the "
                        "/run/nvct lock (rounds: a quarter of --runs, at least 3)")
    parser.add_argument("--cases", help="only these container cases (comma-separated names, e.g. "
                        "jit-cdi_8gpu,gpus-hook_8gpu; plain runc always runs), no other figures")
    parser.add_argument("--other", metavar="BINDIR", action="append", help="with --cases: each case also "
                        "through another install's programs (e.g. an older checkout's virtualenv bin), as "
                        "NAME@other (a second --other: NAME@other2, ...), "
                        "interleaved in the same run, its configs copied so their /run/nvct records stay apart")
    parser.add_argument("--reference", metavar="BINDIR", help="with --cases: also NVIDIA's programs built by "
                        "../shared/reference/build-reference.sh (their bin dir) on the 8-GPU node, as "
                        "reference_* cases (see _reference_setup); not with the shim_plain case")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.py needs root (simulated node, containers)")

    from nvct.simulate.node import cached_node
    from tests.support.rootfs import make_rootfs

    _forget_recorded_runtimes()
    work = tempfile.mkdtemp(prefix="nvct-bench-")
    try:
        nodes = {"8gpu": cached_node(os.path.join(work, "sim")),
                 "64gpu": cached_node(os.path.join(work, "sim"), gpus=64, mig=False)}
        figures: dict = {"load_average_at_start": os.getloadavg()[0]}
        rootfs = make_rootfs(work)
        if opts.reference:
            _reference_setup(nodes["8gpu"], work, opts.reference)
        if opts.batches:
            batch_figures(figures, nodes, work, max(opts.runs // 4, 3))
        elif opts.cases:
            _container_figures(figures, nodes, rootfs, work, opts.runs, {}, set(opts.cases.split(",")),
                               other=opts.other, reference=opts.reference)
        else:
            _all_figures(figures, nodes, rootfs, work, opts)
        figures["load_average_at_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for key, value in figures.items():
        print(f"{key:44s} {value:.2f}" if isinstance(value, float) else f"{key:44s} {value}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(figures, f, indent=2)


def _forget_recorded_runtimes() -> None:
    """Start from an empty runtime cache, as a node with a config or two has it: the sh front reads
    it a byte per system call, and a test machine's holds a line per test config (up to 64)."""
    from nvct.oci import runtime as lowlevel

    with contextlib.suppress(FileNotFoundError):
        os.unlink(lowlevel.CACHE)


def _all_figures(figures: dict, nodes: dict, rootfs: str, work: str, opts) -> None:
    toolkits = install_toolkits(nodes["8gpu"], work)
    if not opts.quick:
        _process_figures(figures, nodes, rootfs, work, opts.runs)
        for name, ms in installed_startup_ms(toolkits, rootfs, opts.runs).items():
            figures[f"{name}_ms"] = ms
    _container_figures(figures, nodes, rootfs, work, opts.runs, toolkits)
    batch_figures(figures, nodes, work, max(opts.runs // 4, 3))
    _generate_figures(figures, nodes, opts.runs)
    for name, ms in podman_hooks_ms(work, nodes["8gpu"]["config"], max(opts.runs // 2, 3)).items():
        figures[f"{name}_ms"] = ms
        if name != "podman_plain":
            figures[f"{name}_added_ms"] = ms - figures["podman_plain_ms"]
            figures[f"{name}_ratio"] = ms / figures["podman_plain_ms"]


def _process_figures(figures: dict, nodes: dict, rootfs: str, work: str, runs: int) -> None:
    from tests.support.bundle import make_bundle

    for name, node in nodes.items():
        figures[f"inprocess_{name}_ms"] = in_process(node, runs * 5)
    baseline_import = _process_ms([PY, "-c", "pass"], runs)
    figures["python_start_ms"] = baseline_import
    for module in ("nvct.programs.shim", "nvct.programs.hook", "nvct.cli", "nvct.hooks"):
        figures[f"import_{module}_ms"] = import_time(module)
    plain = make_bundle(os.path.join(work, "plain-passthrough"), rootfs, ["true"])
    figures["heavy_modules_on_passthrough"] = heavy_modules_after_passthrough(plain)
    runc_version = _process_ms([RUNC, "--version"], runs)
    shim_version = _process_ms([SHIM, "--version"], runs)
    figures["runc_version_ms"] = runc_version
    figures["shim_version_ms"] = shim_version
    figures["passthrough_added_ms"] = shim_version - runc_version
    figures["passthrough_ratio"] = shim_version / runc_version
    startup = dropin_startup_ms(rootfs, runs)
    for name, ms in startup.items():
        figures[f"{name}_ms"] = ms
        figures[f"{name}_ratio_to_nvct_hook"] = ms / startup["nvct_hook_unknown"]


#: The reference's default config.toml, as its packages install it.
REFERENCE_CONFIG = os.path.join(HERE, "reference-config.toml")


def default_configs(work: str) -> dict[str, str]:
    """nvct's shipped config and the reference's default one, copied into ``work``, old enough to
    be recorded at once (nvct.oci.runtime.identity): name -> path."""
    out = {}
    shipped = subprocess.run([os.path.join(BIN, "nvct"), "config", "default"], capture_output=True, text=True,
                             check=True).stdout
    with open(REFERENCE_CONFIG) as f:
        reference = f.read()
    for name, text in (("shipped", shipped), ("reference", reference)):
        path = os.path.join(work, f"{name}-config.toml")
        with open(path, "w") as f:
            f.write(text)
        then = time.time() - 60
        os.utime(path, (then, then))
        out[name] = path
    return out


def _container_figures(figures: dict, nodes: dict, rootfs: str, work: str, runs: int,
                       toolkits: dict[str, str], only: set[str] | None = None, other: list[str] | None = None,
                       reference: str | None = None) -> None:
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cases = {"runc_plain": Case([RUNC], make_bundle(os.path.join(work, "plain"), rootfs, ["true"])),
             "shim_plain": Case([SHIM], os.path.join(work, "plain"), env)}
    # A container without a GPU on a node with a standard config: nvct's own (`nvct config default`)
    # and the reference's default config.toml; both set annotation-prefixes, as migrating nodes keep.
    for name, cfg in default_configs(work).items():
        cases[f"shim_plain_{name}_config"] = Case([SHIM], os.path.join(work, "plain"),
                                                  dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=cfg))
    wanted = [("jit-cdi", "8gpu", "all"), ("legacy", "8gpu", "all"), ("cdi", "8gpu", "nvidia.com/gpu=all"),
              ("jit-cdi", "64gpu", "all"), ("cdi", "64gpu", "nvidia.com/gpu=all")]
    for mode, size, devices in wanted:
        name = f"{mode}_{size}"
        cfg = os.path.join(work, f"{name}.toml")
        extra = f'\n[nvidia-container-runtime]\nmode = "{mode}"\n'
        if mode == "cdi":
            spec_dir = os.path.join(work, f"cdi-{size}")
            os.makedirs(spec_dir)
            generated = subprocess.run([os.path.join(BIN, "nvct"), "cdi", "generate", "--output",
                                        os.path.join(spec_dir, "nvidia.yaml")], check=True,
                                       env=dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=nodes[size]["config"]),
                                       stderr=subprocess.DEVNULL)
            assert generated.returncode == 0
            extra += f'\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir}"]\n'
        with open(nodes[size]["config"]) as src, open(cfg, "w") as f:
            f.write(src.read() + extra)
        bundle = make_bundle(os.path.join(work, name), make_rootfs(work, name=f"rootfs-{name}"),
                             ["true"], env=[f"NVIDIA_VISIBLE_DEVICES={devices}"])
        cases[name] = Case([SHIM], bundle, dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=cfg))
    # docker --gpus: the hook in a plain spec under plain runc, no shim (issue 11's figure).
    hook = {"path": os.path.join(BIN, "nvidia-container-runtime-hook"),
            "args": ["nvidia-container-runtime-hook", "prestart"],
            "env": [f"NVIDIA_CTK_CONFIG_FILE_PATH={nodes['8gpu']['config']}", "PATH=/usr/bin:/bin"]}
    cases["gpus-hook_8gpu"] = Case([RUNC], make_bundle(
        os.path.join(work, "gpus-hook"), make_rootfs(work, name="rootfs-gpus-hook"), ["true"],
        env=["NVIDIA_VISIBLE_DEVICES=all"], hooks={"prestart": [hook]}))
    for name, toolkit in toolkits.items():  # their configs: the 8-GPU node, jit-cdi
        bundle = make_bundle(os.path.join(work, f"{name}-jit"), make_rootfs(work, name=f"rootfs-{name}"),
                             ["true"], env=["NVIDIA_VISIBLE_DEVICES=all"])
        cases[f"jit-cdi_8gpu_{name}"] = Case([os.path.join(toolkit, "nvidia-container-runtime")], bundle, env)
    if only:
        cases = {name: case for name, case in cases.items() if name == "runc_plain" or name in only}
    ours = list(cases.items())
    for i, bindir in enumerate(other or ()):
        tag = "other" if i == 0 else f"other{i + 1}"
        cases.update({f"{name}@{tag}": _other_case(case, bindir, work, tag) for name, case in ours
                      if name != "runc_plain"})
    if reference:
        cases.update(_reference_cases(nodes["8gpu"], work, reference, env))
    cpu: dict[str, float] = {}
    medians = lifecycles_ms(cases, runs, cpu)
    plain_ms = medians["runc_plain"]
    for name, ms in medians.items():
        figures[f"{name}_lifecycle_ms"] = ms
        figures[f"{name}_cpu_ms"] = cpu[name]
        if name != "runc_plain":
            figures[f"{name}_added_ms"] = ms - plain_ms
            figures[f"{name}_ratio"] = ms / plain_ms
            figures[f"{name}_cpu_ratio"] = cpu[name] / cpu["runc_plain"]


def _other_case(case: Case, bindir: str, work: str, tag: str = "other") -> Case:
    """``case`` through the programs in ``bindir``: the shim in its argv and the hook in its spec
    swapped, its config copied to a path of its own (the /run/nvct records are per config path)."""
    swap = {SHIM: os.path.join(bindir, "nvidia-container-runtime"),
            os.path.join(BIN, "nvidia-container-runtime-hook"): os.path.join(bindir, "nvidia-container-runtime-hook")}
    env = dict(case.env) if case.env is not None else None
    cfg = (env or {}).get("NVIDIA_CTK_CONFIG_FILE_PATH")
    if cfg:
        env["NVIDIA_CTK_CONFIG_FILE_PATH"] = _copy_old(cfg, f"{cfg}.{tag}.toml")
    bundle = os.path.join(work, f"{tag}-" + os.path.basename(case.bundle.rstrip("/")))
    if not os.path.isdir(bundle):
        os.makedirs(bundle)
        with open(os.path.join(case.bundle, "config.json")) as f:
            spec = json.load(f)
        spec["root"]["path"] = case.rootfs  # shared: each run starts from its pristine files
        for hook in spec.get("hooks", {}).get("prestart", []):
            hook["path"] = swap.get(hook["path"], hook["path"])
            hook["env"] = [e if not e.startswith("NVIDIA_CTK_CONFIG_FILE_PATH=") else
                           "NVIDIA_CTK_CONFIG_FILE_PATH=" + _copy_old(e.split("=", 1)[1], e.split("=", 1)[1]
                                                                      + f".{tag}.toml") for e in hook.get("env", [])]
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(spec, f)
    return Case([swap.get(a, a) for a in case.argv], bundle, env)


def _copy_old(src: str, dst: str) -> str:
    """``src`` copied to ``dst``, old enough to be recorded at once (nvct.oci.runtime.identity)."""
    if not os.path.exists(dst):
        shutil.copyfile(src, dst)
        then = time.time() - 60
        os.utime(dst, (then, then))
    return dst


def _reference_config(node: dict, work: str, bindir: str, mode: str, spec_dir: str = "/etc/cdi") -> str:
    """The reference's default config.toml for ``mode`` on ``node``: its programs, the node's driver
    root, plain runc; ``load-kmods`` off (no module to load on a simulated node); ``cuda-compat-mode``
    empty (the hook of v1.20 passes ``--cuda-compat-mode`` to libnvidia-container, which knows it
    from 1.18 on: 1.17.0 is the one its build script builds)."""
    with open(REFERENCE_CONFIG) as f:
        text = f.read()
    for old, new in (('#root = "/run/nvidia/driver"', f'root = "{node["roots"]["driver_root"]}"'),
                     ('#path = "/usr/bin/nvidia-container-cli"', f'path = "{bindir}/nvidia-container-cli"'),
                     ("load-kmods = true", "load-kmods = false"), ('mode = "auto"', f'mode = "{mode}"'),
                     ('runtimes = ["docker-runc", "runc", "crun"]', f'runtimes = ["{RUNC}"]'),
                     ('cuda-compat-mode = "ldconfig"', 'cuda-compat-mode = ""'),
                     ('path = "nvidia-container-runtime-hook"', f'path = "{bindir}/nvidia-container-runtime-hook"'),
                     ('path = "nvidia-ctk"', f'path = "{bindir}/nvidia-ctk"'),
                     ('spec-dirs = ["/etc/cdi", "/var/run/cdi"]', f'spec-dirs = ["{spec_dir}"]')):
        assert old in text, old
        text = text.replace(old, new, 1)
    path = os.path.join(work, f"reference-{mode}.toml")
    with open(path, "w") as f:
        f.write(text + "\n[features]\nallow-cuda-compat-libs-from-container = true\n")
    return path


def _reference_setup(node: dict, work: str, bindir: str) -> None:
    """What NVIDIA's programs need to run on the simulated node, for this process and its children:

    * the host's glibc in the node's root: libnvidia-container loads NVML in a chroot there;
    * a mount namespace of our own (private), with the node's ``/proc/driver`` and ``/proc/devices``
      where libnvidia-container reads them;
    * the legacy-mode config at the default path, in an overlay on ``/etc``: the runtime appends its
      hook with no environment, so the hook reads ``/etc/nvidia-container-runtime/config.toml``.

    Every case of the run shares the namespace (runc's and nvct's cases included).
    """
    import ctypes

    root = node["roots"]["driver_root"]
    libdir = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    for lib in ("libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6"):
        shutil.copy2(os.path.join("/lib/x86_64-linux-gnu", lib), libdir)
    os.makedirs(os.path.join(root, "lib64"), exist_ok=True)
    shutil.copy2("/lib64/ld-linux-x86-64.so.2", os.path.join(root, "lib64"))
    if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise SystemExit(f"--reference: unshare: {os.strerror(ctypes.get_errno())}")
    upper, scratch = _mkdir(os.path.join(work, "etc-upper")), _mkdir(os.path.join(work, "etc-work"))
    os.makedirs(os.path.join(upper, "nvidia-container-runtime"))
    shutil.copyfile(_reference_config(node, work, bindir, "legacy"),
                    os.path.join(upper, "nvidia-container-runtime", "config.toml"))
    proc = node["roots"]["proc_root"]
    for argv in (["mount", "--make-rprivate", "/"], ["mount", "--bind", os.path.join(proc, "driver"), "/proc/driver"],
                 ["mount", "--bind", os.path.join(proc, "devices"), "/proc/devices"],
                 ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/etc,upperdir={upper},workdir={scratch}",
                  "/etc"]):
        subprocess.run(argv, check=True)


def _proc_hook(node: dict, rootfs: str, work: str) -> dict:
    """A prestart hook entry that binds the node's ``/proc/driver`` into the container's procfs, where
    libnvidia-container hides and re-exposes ``/proc/driver/nvidia`` (this kernel has no NVIDIA
    module; runc refuses a spec mount under /proc). Its cost is measured alone (``runc_prochook``)."""
    proc = node["roots"]["proc_root"]
    path = os.path.join(work, f"prochook-{os.path.basename(rootfs)}.sh")
    with open(path, "w") as f:
        f.write('#!/bin/sh\nstate=$(cat)\npid=${state#*\\"pid\\":}\npid=${pid%%[,\\}]*}\n'
                f'exec nsenter -t "$pid" -m mount --bind {proc}/driver {rootfs}/proc/driver\n')
    os.chmod(path, 0o755)
    return {"path": path, "args": ["prochook"]}


def _reference_cases(node: dict, work: str, bindir: str, env: dict) -> dict[str, Case]:
    """NVIDIA's programs on the 8-GPU node: legacy mode through its runtime, its hook as ``docker
    --gpus`` runs it, and a container without a GPU under its default config (legacy mode: its
    runtime is in Go, so the mode does not change a no-GPU start); and ``runc_prochook``, plain runc
    with only the /proc/driver hook the GPU cases carry, their baseline."""
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    legacy = _reference_config(node, work, bindir, "legacy")
    spec_dir = _mkdir(os.path.join(work, "reference-cdi"))
    subprocess.run([f"{bindir}/nvidia-ctk", "cdi", "generate", "--quiet", "--driver-root", node["roots"]["driver_root"],
                    "--dev-root", node["roots"]["dev_root"], "--nvidia-cdi-hook-path", f"{bindir}/nvidia-cdi-hook",
                    "--output", os.path.join(spec_dir, "nvidia.yaml")], check=True, env={"PATH": "/usr/bin:/bin"})
    cdi = _reference_config(node, work, bindir, "cdi", spec_dir)
    configs = {"reference_jit-cdi_8gpu": _reference_config(node, work, bindir, "jit-cdi"), "reference_cdi_8gpu": cdi}
    cases = {}
    for name, argv, gpu, hook in (("runc_prochook", [RUNC], True, None),
                                  ("reference_legacy_8gpu", [f"{bindir}/nvidia-container-runtime"], True, None),
                                  ("reference_jit-cdi_8gpu", [f"{bindir}/nvidia-container-runtime"], True, None),
                                  ("reference_cdi_8gpu", [f"{bindir}/nvidia-container-runtime"], "nvidia.com/gpu=all",
                                   None),
                                  ("reference_gpus-hook_8gpu", [RUNC], True,
                                   {"path": f"{bindir}/nvidia-container-runtime-hook",
                                    "args": ["nvidia-container-runtime-hook", "prestart"],
                                    "env": [f"NVIDIA_CTK_CONFIG_FILE_PATH={legacy}", "PATH=/usr/bin:/bin"]}),
                                  ("reference_plain_reference_config", [f"{bindir}/nvidia-container-runtime"],
                                   False, None)):
        rootfs = make_rootfs(work, name=f"rootfs-{name}")
        hooks = [_proc_hook(node, rootfs, work)] if gpu else []
        bundle = make_bundle(os.path.join(work, name), rootfs, ["true"],
                             env=[f"NVIDIA_VISIBLE_DEVICES={gpu if isinstance(gpu, str) else 'all'}"] if gpu else [],
                             hooks={"prestart": hooks + ([hook] if hook else [])} if hooks else None)
        cases[name] = Case(argv, bundle, dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=configs.get(name, legacy)))
    return cases


#: Concurrent batch sizes (issue 28): as many lifecycles at once as an engine starts after a reboot.
BATCH_SIZES = (8, 16, 32)


def _batch_cases(nodes: dict, work: str, size: int, env: dict) -> dict[str, list[Case]]:
    """name -> ``size`` lifecycles, each with a bundle and root of its own: plain runc, the shim
    without a GPU (nvct's shipped config), and one GPU each (the 8-GPU node) in jit-cdi, legacy
    and cdi mode, the GPUs taken in turn."""
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    node = nodes["8gpu"]
    shipped = default_configs(_mkdir(os.path.join(work, f"batch{size}-configs")))["shipped"]
    configs = {"runc_plain": None, "shim_plain_shipped_config": shipped}
    for mode in ("jit-cdi", "legacy", "cdi"):
        extra = f'\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{RUNC}"]\n'
        if mode == "cdi":
            spec_dir = _mkdir(os.path.join(work, f"batch{size}-cdi"))
            subprocess.run([os.path.join(BIN, "nvct"), "cdi", "generate", "--output",
                            os.path.join(spec_dir, "nvidia.yaml")], check=True,
                           env=dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=node["config"]), stderr=subprocess.DEVNULL)
            extra += f'\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir}"]\n'
        path = os.path.join(work, f"batch{size}-{mode}.toml")
        with open(node["config"]) as src, open(path, "w") as f:
            f.write(src.read() + extra)
        then = time.time() - 60  # old enough to be recorded at once (nvct.oci.runtime.identity)
        os.utime(path, (then, then))
        configs[f"{mode}_8gpu"] = path
    cases: dict[str, list[Case]] = {}
    for name, cfg in configs.items():
        cases[name] = []
        for i in range(size):
            gpu = node["gpus"][i % len(node["gpus"])]["uuid"]
            gpu_env = [f"NVIDIA_VISIBLE_DEVICES={gpu}"] if name.endswith("_8gpu") else []
            d = os.path.join(work, f"batch{size}", name, str(i))
            bundle = make_bundle(os.path.join(d, "bundle"), make_rootfs(d), ["true"], env=gpu_env)
            cases[name].append(Case([RUNC] if cfg is None else [SHIM], bundle,
                                    None if cfg is None else dict(env, NVIDIA_CTK_CONFIG_FILE_PATH=cfg)))
    return cases


def _batch_ms(cases: list[Case]) -> float:
    """Wall time of ``cases`` run all at once (from a common start to the last delete), each ok."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.runtimes import _subreaper, create_start_delete

    for case in cases:
        case.reset()
    barrier = threading.Barrier(len(cases) + 1)

    def one(case: Case):
        barrier.wait()
        return create_start_delete(case.argv, case.bundle, env=case.env, timeout=300)

    # One subreaper for the batch: each lifecycle's own would be undone by the first to finish.
    with _subreaper(), ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(one, case) for case in cases]
        barrier.wait()
        t = time.perf_counter()
        results = [f.result() for f in futures]
        elapsed = (time.perf_counter() - t) * 1000
    for result in results:
        if result.rc != 0:
            raise SystemExit(f"batch: container failed: {result.describe()}")
    return elapsed


def batch_figures(figures: dict, nodes: dict, work: str, rounds: int, sizes=BATCH_SIZES) -> None:
    """Concurrent lifecycles: per batch size, the batch's wall time for each case, interleaved round
    by round with the same batch of plain runc containers; median and ratio to plain runc."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for size in sizes:
        cases = _batch_cases(nodes, work, size, env)
        for batch in cases.values():
            _batch_ms(batch)  # the records in /run/nvct written, the page cache warm
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, batch in cases.items():
                times[name].append(_batch_ms(batch))
        plain = statistics.median(times["runc_plain"])
        for name, values in times.items():
            figures[f"batch{size}_{name}_ms"] = statistics.median(values)
            if name != "runc_plain":
                figures[f"batch{size}_{name}_ratio"] = statistics.median(values) / plain
        shutil.rmtree(os.path.join(work, f"batch{size}"), ignore_errors=True)
    figures.update(lock_figures(nodes["8gpu"], work, max(sizes)))


_LOCK_PROBE = r"""
import fcntl, json, os, sys, time
real, taken = fcntl.flock, []
def flock(fd, op):
    t = time.monotonic()
    real(fd, op)
    taken.append((op, t, time.monotonic()))
fcntl.flock = flock
os.execve = lambda *a: None
sys.argv = [%(shim)r]
from nvct.programs.shim import main
main(["create", "--bundle", %(bundle)r, "x"])
ex = [(t0, t1) for op, t0, t1 in taken if op == fcntl.LOCK_EX]
un = [t0 for op, t0, t1 in taken if op == fcntl.LOCK_UN]
print(json.dumps({"waited": [t1 - t0 for t0, t1 in ex], "held": [u - t1 for (t0, t1), u in zip(ex, un)]}))
"""


def lock_figures(node: dict, work: str, size: int) -> dict:
    """The /run/nvct writers' flock with ``size`` shims at once (a container without a GPU, nvct's
    shipped config, the runtime not exec'd): how many take it, how long they wait and hold it,
    with no record for the config (a node's first starts after a boot or a config change) and
    with one (every later start)."""
    from tests.support.bundle import make_bundle

    cfg = default_configs(_mkdir(os.path.join(work, f"lock{size}-configs")))["shipped"]
    bundle = make_bundle(os.path.join(work, "lock-bundle"), make_rootfs_once(work), ["true"])
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": cfg}
    code = _LOCK_PROBE % {"shim": SHIM, "bundle": bundle}
    out = {}
    for phase in ("no_record", "recorded"):
        if phase == "no_record":
            _forget_recorded_runtimes()
        procs = [subprocess.Popen([PY, "-I", "-c", code], env=env, stdout=subprocess.PIPE) for _ in range(size)]
        waited, held, takers = [], [], 0
        for p in procs:
            data = json.loads(p.communicate()[0] or b"{}")
            takers += bool(data.get("held"))
            waited += data.get("waited", [])
            held += data.get("held", [])
        out[f"lock{size}_{phase}_takers"] = takers
        out[f"lock{size}_{phase}_held_median_ms"] = statistics.median(held) * 1000 if held else 0.0
        out[f"lock{size}_{phase}_held_max_ms"] = max(held) * 1000 if held else 0.0
        out[f"lock{size}_{phase}_waited_max_ms"] = max(waited) * 1000 if waited else 0.0
    return out


def make_rootfs_once(work: str) -> str:
    from tests.support.rootfs import make_rootfs

    path = os.path.join(work, "rootfs-lock")
    return path if os.path.isdir(path) else make_rootfs(work, name="rootfs-lock")


def _generate_figures(figures: dict, nodes: dict, runs: int) -> None:
    nvct = os.path.join(BIN, "nvct")
    cases: dict[str, tuple[list[str], dict | None]] = {"python_isolated_start": ([PY, "-I", "-c", "pass"], None)}
    for size, node in nodes.items():
        env = {"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": node["config"]}
        cases[f"cdi_generate_{size}"] = ([nvct, "cdi", "generate"], env)
    medians = interleaved_ms(cases, runs)
    for name, ms in medians.items():
        figures[f"{name}_ms"] = ms
        if name != "python_isolated_start":
            figures[f"{name}_ratio_to_python_start"] = ms / medians["python_isolated_start"]


if __name__ == "__main__":
    main()
