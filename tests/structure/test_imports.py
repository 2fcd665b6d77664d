"""What each program imports on its path, read from ``python -X importtime``.

Every container start runs the shim and a hook or two: a module they import is paid on every
start. Each program runs as installed (its sh front, then the interpreter with ``-I``) with
``-X importtime`` added by a ``python3`` next to it, which the fronts prefer, along a real path:
a GPU container's create in each mode, the hooks those creates write into the spec, run as the
runtime would run them. The forbidden lists are today's truth; a module leaves a list only with
a reason (docs/contributing.md, "Imports").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import VENV_BIN, node_config
from tests.support.proc import wait_for

#: Never on a container start: the CLI's and the operator's libraries, and what nvct avoids on purpose;
#: nor, since the launcher starts Python with -S, what the .pth files' import lines and sitecustomize load.
START = ("click", "tomlkit", "elftools", "json", "dataclasses", "argparse", "subprocess", "logging",
         "nvct.cli", "nvct.doctor", "nvct.engines", "nvct.toolkit", "nvct.simulate", "nvct.discover.nvml",
         "_distutils_hack", "sitecustomize")
#: The shim outside cdi mode reads no YAML (CDI specs are YAML).
SHIM = START + ("yaml",)
#: A GPU create without NVIDIA_REQUIRE_* or CUDA_VERSION parses no requirement, and writes no step that
#: only the hook runs.
GPU_CREATE = ("nvct.request.requirements", "nvct.hooks.limits", "nvct.hooks.mounts", "nvct.hooks.requirements")
#: The hooks run inside every GPU container's start: not even tomllib (the legacy hook's config comes
#: from the parse cache), re, typing or enum.
HOOK = START + ("yaml", "tomllib", "re", "typing", "enum", "nvct.cdi")
#: ``nvct hook ...`` is dispatched by nvct.cli's ``main`` before click: the package, none of its modules
#: (nor importlib, which nvct.cli uses to load a subcommand, and its warnings).
NVCT_HOOK = tuple("nvct.cli.*" if m == "nvct.cli" else m for m in HOOK) + ("importlib", "warnings")
#: The hook a jit-cdi create leaves once the shim wrote the links and the ld cache: the params mask alone,
#: without the other steps' modules (nvct.hooks.steps imports a step's module when such a step runs).
MASK_HOOK = NVCT_HOOK + ("nvct.hooks.compat", "nvct.hooks.files", "nvct.hooks.ldcache", "nvct.hooks.limits",
                         "nvct.hooks.mounts", "nvct.hooks.requirements", "nvct.rootfs.ldconfig",
                         "nvct.rootfs.cachepatch", "nvct.discover", "nvct.linux.elf")
#: ``--version`` of the programs the runtimes call: nothing but the version.
VERSION = HOOK + ("nvct.config", "nvct.rootfs", "nvct.hooks", "nvct.edits", "nvct.discover")


def imported(bin_dir, program: str, args, *, env=None, stdin: str = "") -> set[str]:
    """The modules ``program`` (in ``bin_dir``) imports, run through its installed front."""
    env = {"PATH": "/usr/bin:/bin", **(env or {})}
    proc = subprocess.run([os.path.join(bin_dir, program), *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 0, errors
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def found(modules: set[str], forbidden) -> list[str]:
    """The forbidden modules among ``modules``: a name covers its submodules, ``name.*`` them alone."""
    return sorted(m for m in modules if any(m.startswith(f[:-1]) if f.endswith(".*") else
                                            m == f or m.startswith(f + ".") for f in forbidden))


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    """The installed programs, beside a ``python3`` that adds ``-X importtime``."""
    directory = tmp_path_factory.mktemp("bin")
    for program in ("nvct", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-cdi-hook",
                    "nvidia-ctk", "nvidia-container-cli"):
        shutil.copy(os.path.join(VENV_BIN, program), directory / program)
    python = directory / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -X importtime "$@"\n')
    python.chmod(0o755)
    return str(directory)


def _gpu_create(tmp_path, bin_dir, node, mode: str, root: str = "rootfs") -> tuple[set[str], dict, str]:
    """The shim's create of a container asking for every GPU; the modules, the written spec, the config.
    ``root``: the spec's root (an empty folder in the bundle: the shim leaves the whole chain to the hook)."""
    fake_runtime = tmp_path / "runc"
    fake_runtime.write_text("#!/bin/sh\nexit 0\n")
    fake_runtime.chmod(0o755)
    config = node_config(tmp_path, node, mode=mode, runtime=str(fake_runtime))
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": root},
        "process": {"args": ["true"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}}))
    modules = imported(bin_dir, "nvidia-container-runtime", ["create", "--bundle", str(bundle), "c1"],
                       env={"NVIDIA_CTK_CONFIG_FILE_PATH": config})
    return modules, json.loads((bundle / "config.json").read_text()), str(bundle)


def _run_hooks(bin_dir, spec: dict, bundle: str, pid: int) -> set[str]:
    """Every hook of ``spec`` as the runtime runs it: its argv and env, the state on stdin."""
    modules = set()
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "created", "pid": pid, "bundle": bundle})
    hooks = [hook for stage in spec.get("hooks", {}).values() for hook in stage]
    assert hooks, spec
    for hook in hooks:
        assert os.path.dirname(hook["path"]) == bin_dir, hook
        env = dict(entry.split("=", 1) for entry in hook.get("env", ()))
        modules |= imported(bin_dir, os.path.basename(hook["path"]), hook["args"][1:], env=env, stdin=state)
    return modules


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy", "cdi"])
def test_a_gpu_create_imports_no_forbidden_module(tmp_path, bin_dir, sim_node, mode):
    modules, _, _ = _gpu_create(tmp_path, bin_dir, sim_node, mode)
    assert "nvct.programs.shim" in modules
    assert found(modules, (START if mode == "cdi" else SHIM) + GPU_CREATE) == []


def test_the_jit_cdi_hook_chain_imports_no_forbidden_module(tmp_path, bin_dir, sim_node):
    _, spec, bundle = _gpu_create(tmp_path, bin_dir, sim_node, "jit-cdi")
    modules = _run_hooks(bin_dir, spec, bundle, pid=0)  # the chain names the container's root itself
    assert "nvct.hooks.steps" in modules
    assert found(modules, NVCT_HOOK) == []


def test_the_jit_cdi_hook_of_a_prepared_root_imports_only_the_mask(tmp_path, bin_dir, sim_node, rootfs):
    """An image with an ld cache: the shim wrote the links and the cache (nvct.modifier.prepare), the hook masks."""
    modules, spec, bundle = _gpu_create(tmp_path, bin_dir, sim_node, "jit-cdi", root=rootfs)
    assert "nvct.rootfs.cachepatch" in modules  # the shim patched the image's cache
    hook_modules = _run_hooks(bin_dir, spec, bundle, pid=0)
    assert "nvct.hooks.procmask" in hook_modules
    assert found(hook_modules, MASK_HOOK) == []


def test_the_legacy_prestart_hook_imports_no_forbidden_module(tmp_path, bin_dir, sim_node):
    _, spec, bundle = _gpu_create(tmp_path, bin_dir, sim_node, "legacy")
    # The hook enters the container's mount namespace: a private one of a process of ours.
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    try:
        ours = os.readlink("/proc/self/ns/mnt")
        wait_for(lambda: os.readlink(f"/proc/{holder.pid}/ns/mnt") != ours, "the holder's own mount namespace")
        modules = _run_hooks(bin_dir, spec, bundle, pid=holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert "nvct.programs.hook" in modules
    assert found(modules, HOOK) == []


def test_nvidia_cdi_hook_imports_no_forbidden_module(tmp_path, bin_dir):
    root = tmp_path / "rootfs"
    root.mkdir()
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": 0, "root": str(root)})
    modules = imported(bin_dir, "nvidia-cdi-hook", ["create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"],
                       stdin=state)
    assert os.readlink(root / "usr/lib/libcuda.so") == "libcuda.so.1"
    assert found(modules, HOOK) == []


@pytest.mark.parametrize("program, forbidden", [
    ("nvidia-container-runtime-hook", VERSION),
    ("nvidia-ctk", VERSION),
    ("nvidia-container-cli", tuple(m for m in VERSION if m not in ("re", "enum"))),
    ("nvct", tuple(m for m in VERSION if m not in ("click", "nvct.cli", "re", "typing", "enum"))),  # click's CLI
])
def test_version_imports_no_forbidden_module(bin_dir, program, forbidden):
    modules = imported(bin_dir, program, ["--version"])
    assert found(modules, forbidden) == []
