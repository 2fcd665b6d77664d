"""nvct's packages form layers along the data flow; imports run one way only.

A module may import its own package and any package listed before it in
``LAYERS``, never one listed after. Function-local imports count too: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "nvct"

#: Lowest first. Each entry: the package, and its one-line role (docs/contributing.md repeats these).
LAYERS = (
    ("base", "errors, logging, value classes, JSON, atomic files, the parse cache"),
    ("config", "config.toml: reading, the table of keys"),
    ("linux", "kernel interfaces: one libc binding, openat2 and mounts, namespaces, privileges, cgroups and bpf, "
              "ELF, file ownership"),
    ("oci", "the OCI bundle and state, runc's command line, the low-level runtime, the programs' environment"),
    ("discover", "what the host's driver offers: files, ld cache, /proc, NVML"),
    ("node", "the host's side of a GPU: device nodes, /dev/char links, kernel modules"),
    ("request", "what a container asks for: env, mounts, annotations, CDI names, NVIDIA_REQUIRE_*"),
    ("edits", "request + driver -> container edits: the model, how it is built per platform, how a spec takes it"),
    ("rootfs", "writes into a container's root through one verified descriptor; its ld cache"),
    ("hooks", "the in-container step chain and the program that runs it"),
    ("cdi", "CDI specs: schema, registry, generation, the modes that read them"),
    ("modifier", "the shim's modes: spec edits, early writes (prepare), the legacy hook's path"),
    ("engines", "docker, containerd and cri-o configuration files"),
    ("nri", "the NRI plugin for containerd and cri-o"),
    ("toolkit", "the operator's installer: a self-contained tree, its wrappers, the package's removal"),
    ("doctor", "checks of a node, explain, which path a CLI's --gpus takes"),
    ("simulate", "the simulated GPU node used by tests and demos"),
    ("cli", "the nvct command line"),
    ("programs", "each entry program, thin: the shim, the hook, nvidia-ctk and friends"),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "nvct" else None


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "nvct":
                found += [(node.lineno, "nvct." + a.name) for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.parent != ROOT)


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANK)


def test_no_module_sits_at_the_top_level() -> None:
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_run_down_the_layers(path: pathlib.Path) -> None:
    own = path.relative_to(ROOT).parts[0]
    against = [f"line {line}: {module} ({_package(module)} is above {own})"
               for line, module in _imports(path)
               if _package(module) in RANK and RANK[_package(module)] > RANK[own]]
    assert not against
