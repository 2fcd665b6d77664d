"""GPU containers through nvct's shim on the simulated node, in any mode, under runc or crun.

For tests that must go through the real runtimes (hostile images, request
policy): one call writes the config (the node's roots, the mode, the
low-level runtime, and for ``cdi`` mode a spec dir holding the spec
``nvct cdi generate`` wrote for the node), the bundle, and runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Mapping, Sequence

from .bundle import edit_config, make_bundle
from .proc import Result
from .runtimes import RUNTIMES, run_container

VENV_BIN = os.path.dirname(sys.executable)
SHIM = os.path.join(VENV_BIN, "nvidia-container-runtime")
NVCT = os.path.join(VENV_BIN, "nvct")
PATH_ENV = "PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"
#: Every mode a request can be realized in: by the hook, in the spec, from a spec dir.
MODES = ("legacy", "jit-cdi", "cdi")


def need_runtime(runtime: str) -> None:
    """Skip (with the reason) unless root, the rootfs tools and ``runtime`` are here."""
    from . import cgroupfix
    from .fixtures import need_binaries, need_root, need_rootfs_tools

    need_root()
    need_rootfs_tools()
    need_binaries(RUNTIMES[runtime][0])
    if runtime == "crun":
        cgroupfix.ensure_crun_works()


def node_config(tmp_path, node: Mapping, *, mode: str, runtime: str = "runc", extra: str = "",
                top: str = "", cli: str = "") -> str:
    """A config file: the node's three roots, plus the mode and low-level runtime.

    In ``cdi`` mode the spec dirs are a private directory holding the node's
    generated spec, unless ``extra`` has its own ``modes.cdi`` table. ``top``: top-level keys; ``cli``: keys of
    ``[nvidia-container-cli]``; ``extra``: appended (tables of its own).
    """
    with open(node["config"]) as f:
        base = f.read()
    if cli:
        base = base.replace("[nvidia-container-cli]\n", f"[nvidia-container-cli]\n{cli}\n", 1)
    path = os.path.join(str(tmp_path), "config.toml")
    with open(path, "w") as f:
        f.write(top + "\n" + base)
        f.write(f'\n[nvidia-container-runtime]\nmode = "{mode}"\nruntimes = ["{runtime}"]\n')
        f.write(f'debug = "{tmp_path}/nvct.log"\n')
        own_specs = mode == "cdi" and "[nvidia-container-runtime.modes.cdi]" not in extra
        if own_specs:
            f.write(f'[nvidia-container-runtime.modes.cdi]\nspec-dirs = ["{spec_dir(tmp_path)}"]\n')
        f.write(extra)
    if own_specs:
        generate_spec(tmp_path, path)  # with this config, as on a node (its ldconfig, ...)
    return path


def spec_dir(tmp_path, node: Mapping | None = None) -> str:
    """``tmp_path/cdi``, the spec dir of a cdi-mode config; with ``node``, holding its spec."""
    directory = os.path.join(str(tmp_path), "cdi")
    os.makedirs(directory, exist_ok=True)
    if node is not None and not os.path.exists(os.path.join(directory, "nvidia.yaml")):
        generate_spec(tmp_path, node["config"])
    return directory


def generate_spec(tmp_path, config: str, vendor: str = "nvidia.com") -> str:
    """``nvct cdi generate`` under ``config`` into ``tmp_path/cdi/nvidia.yaml``."""
    spec = os.path.join(spec_dir(tmp_path), "nvidia.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVCT_", "NVIDIA_CTK_"))}
    env["NVIDIA_CTK_CONFIG_FILE_PATH"] = config
    proc = subprocess.run([NVCT, "cdi", "generate", "--hook-path", NVCT, "--vendor", vendor, "--output", spec],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return spec


def run_gpu(tmp_path, node: Mapping, rootfs: str, *, mode: str, runtime: str = "runc",
            env: Sequence[str] = (), command: str = "true", privileged: bool = False,
            annotations: Mapping[str, str] | None = None, mounts: Sequence[Mapping] = (),
            extra_config: str = "", top_config: str = "", cli_config: str = "",
            name: str = "bundle", timeout: float = 60,
            edit: Callable[[dict], None] | None = None, wrapper: Sequence[str] = ()) -> Result:
    """Run ``sh -c command`` with ``env`` in ``rootfs`` through the shim; the Result, ok or not.

    ``extra_config``/``top_config``/``cli_config``: see :func:`node_config`; ``edit``
    changes the written config.json in place; ``wrapper``: argv the shim runs under
    (e.g. a private mount namespace).
    """
    config = node_config(tmp_path, node, mode=mode, runtime=RUNTIMES[runtime][0], extra=extra_config,
                         top=top_config, cli=cli_config)
    bundle = make_bundle(os.path.join(str(tmp_path), name), rootfs, ["sh", "-c", command],
                         env=[PATH_ENV, *env], privileged=privileged, annotations=annotations,
                         mounts=mounts)
    if edit is not None:
        with edit_config(bundle) as spec:
            edit(spec)
    return run_container([*wrapper, SHIM], bundle, env={"NVIDIA_CTK_CONFIG_FILE_PATH": config,
                                              "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                         log_file=os.path.join(str(tmp_path), f"{name}.log.json"), timeout=timeout)


def refusal(result: Result, tmp_path=None) -> str:
    """The shim's or hook's error text, asserting the start failed without a traceback.

    runc shows a failed hook's stderr; crun does not, so with ``tmp_path``
    nvct's own log there (the ``debug`` file node_config names) counts too.
    """
    assert not result.ok, result.describe()
    text = result.stderr
    log = os.path.join(str(tmp_path), "nvct.log") if tmp_path is not None else None
    if log and os.path.exists(log):
        with open(log) as f:
            text += "".join(line for line in f if '"error"' in line)
    assert "Traceback" not in text and "internal error" not in text, result.describe()
    assert text.strip(), result.describe()
    return text


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path`` in this namespace (none may be left after a run)."""
    from nvct.linux.namespaces import mounts

    prefix = os.path.realpath(path).rstrip("/") + "/"
    return [m.mount_point for m in mounts() if (m.mount_point + "/").startswith(prefix)]


def host_victim(tmp_path) -> tuple[str, str]:
    """A host folder holding one file (``victim``) that a hostile image's links point at."""
    outside = os.path.join(str(tmp_path), "outside")
    os.makedirs(outside)
    victim = os.path.join(outside, "victim")
    with open(victim, "w") as f:
        f.write("host file\n")
    return outside, victim


def assert_untouched(outside: str, victim: str) -> None:
    """Nothing was written, linked or added in :func:`host_victim`'s folder."""
    assert sorted(os.listdir(outside)) == ["victim"]
    assert not os.path.islink(victim)
    with open(victim) as f:
        assert f.read() == "host file\n"
