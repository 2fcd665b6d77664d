"""Fixtures for the CDI tests: spec files, simulated nodes, nvct's entry points.

Simulated nodes need root (mknod); tests that use them skip with the reason
otherwise. Entry points are the installed console scripts when they sit
beside the interpreter, else small wrappers written into a temp directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nvct.cdi import encoding
from tests.support.fixtures import busybox_image_tar, oci_runtime, private_podman, rootfs, skip  # noqa: F401 - fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: Every GPU of the DGX H100 topology in MIG mode with seven 1g.10gb instances.
_ALL_MIG = {"enabled": True, "instances": ["1g.10gb"] * 7}


def minimal_spec(version: str = "0.5.0", kind: str = "vendor.com/device", name: str = "dev0",
                 **edits) -> dict:
    """A valid spec with one device whose edits are ``edits`` (default: one env var)."""
    return {"cdiVersion": version, "kind": kind,
            "devices": [{"name": name, "containerEdits": edits or {"env": [f"DEV={name}"]}}]}


def write_spec(directory, name: str, spec, fmt: str | None = None) -> str:
    """Write ``spec`` (a mapping, or raw text) to ``directory/name``."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    fmt = fmt or encoding.format_for(name) or "yaml"
    with open(path, "w") as f:
        f.write(spec if isinstance(spec, str) else encoding.dumps(spec, fmt))
    return path


def _need_root() -> None:
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")


@pytest.fixture(scope="session")
def sim_base(tmp_path_factory):
    return tmp_path_factory.mktemp("cdi-simnodes")


@pytest.fixture(scope="session")
def node(sim_base) -> dict:
    """The default simulated node: DGX H100 (8 GPUs), MIG on GPU 0 with two devices."""
    _need_root()
    from nvct.simulate import cached_node

    return cached_node(sim_base)


@pytest.fixture(scope="session")
def mig_node(sim_base) -> dict:
    """8 GPUs, every one in MIG mode with 7 MIG devices (the generate benchmark's shape)."""
    _need_root()
    from nvct.simulate import cached_node
    from nvct.simulate.topology import DEFAULT_TOPOLOGY

    with open(DEFAULT_TOPOLOGY) as f:
        topology = json.load(f)
    for gpu in topology["gpus"]:
        gpu["mig"] = dict(_ALL_MIG)
    return cached_node(sim_base, topology=topology)


def node_config(manifest: dict, overrides: dict | None = None):
    """nvct's Config for a node (its nvct-config.toml), with ``overrides`` merged over it."""
    from nvct.config import file as config

    with open(manifest["config"], "rb") as f:
        data = config.parse_toml(f.read(), manifest["config"])
    return config.Config(deep_merge(data, overrides or {}), manifest["config"], env={})


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def node_driver(manifest: dict):
    from nvct.discover.driver import Driver

    return Driver.from_config(node_config(manifest))


@pytest.fixture(scope="session")
def entry_points(tmp_path_factory) -> dict:
    """Absolute paths of ``nvct`` and ``nvidia-container-runtime`` to execute."""
    out = {}
    bindir = os.path.dirname(sys.executable)
    wrappers = tmp_path_factory.mktemp("bin")
    for name, target in (("nvct", "nvct.cli:main"),
                         ("nvidia-container-runtime", "nvct.programs.shim:main")):
        installed = os.path.join(bindir, name)
        if os.path.isfile(installed) and os.access(installed, os.X_OK):
            out[name] = installed
            continue
        module, func = target.split(":")
        path = wrappers / name
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {REPO!r})\n"
                        f"from {module} import {func}\nsys.exit({func}())\n")
        path.chmod(0o755)
        out[name] = str(path)
    return out


_EXTRA_NODES = (("dev/nvidia-fs0", 246, 0), ("dev/nvidia-fs1", 246, 1), ("dev/infiniband/uverbs0", 231, 192),
                ("dev/infiniband/rdma_cm", 10, 58), ("dev/gdrdrv", 239, 0))


@pytest.fixture(scope="session")
def gated_node(tmp_path_factory):
    """A node of its own with two NVSwitches, GDS, MOFED and GDRCopy nodes, /etc/cufile.json, /run/udev,
    and a render node of group 44 (video) mode 0660."""
    if os.geteuid() != 0:
        skip("needs root (mknod)")
    import json

    from nvct.simulate.node import build_node
    from nvct.simulate.topology import DEFAULT_TOPOLOGY

    with open(DEFAULT_TOPOLOGY) as f:
        topology = json.load(f)
    topology["nvswitches"] = 2
    node = build_node(tmp_path_factory.mktemp("gated") / "node", topology=topology)
    root = node["roots"]["dev_root"]
    for path, major, minor in _EXTRA_NODES:
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        os.mknod(os.path.join(root, path), 0o020666, os.makedev(major, minor))
        os.chmod(os.path.join(root, path), 0o666)
    driver_root = node["roots"]["driver_root"]
    with open(os.path.join(driver_root, "etc/cufile.json"), "w") as f:
        f.write('{"logging": {"level": "ERROR"}}\n')
    os.makedirs(os.path.join(driver_root, "run/udev/data"), exist_ok=True)
    os.chown(os.path.join(root, "dev/dri/renderD128"), 0, 44)
    _add_library(driver_root, "libEGL.so.1", "libEGL.so.1.1.0", tmp_path_factory.mktemp("egl"))
    return node


def _add_library(root: str, soname: str, name: str, scratch) -> None:
    """A glvnd library the driver does not own, for the explicit-libraries flag; the cache rebuilt."""
    from nvct.simulate import ldcache

    libdir = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    src = scratch / "lib.c"
    src.write_text("int egl_probe(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", os.path.join(libdir, name),
                    str(src)], check=True)
    os.symlink(name, os.path.join(libdir, soname))
    ldcache.generate(root)
