"""``nvct simulate``: GPU nodes without GPUs, for tests and CI."""

from __future__ import annotations

import click

from nvct.simulate import build_node
from nvct.simulate.driver import DEFAULT_DRIVER_VERSION


@click.group("simulate", help="Simulated NVIDIA hardware: run GPU containers on machines without a GPU.")
def simulate_group():
    pass


@simulate_group.command("node")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--driver-version", default=DEFAULT_DRIVER_VERSION, show_default=True,
              help="Driver version to simulate (e.g. 535.161.08, 550.54.15, 570.124.06).")
@click.option("--gpus", type=click.IntRange(1, 254), default=None,
              help="Number of GPUs (default: all of the topology; more than it adds synthetic ones).")
@click.option("--mig/--no-mig", default=True, show_default=True, help="Create the topology's MIG devices.")
@click.option("--topology", type=click.Path(dir_okay=False), default=None,
              help="Topology JSON file (default: a DGX H100; schema in docs/simulated-node.md).")
@click.option("--device-nodes/--no-device-nodes", default=True, show_default=True,
              help="Create device nodes (needs root); without them NVML reports no driver loaded.")
@click.option("--force", is_flag=True, help="Build into a non-empty directory that is not a simulated node.")
@click.option("--arch", type=click.Choice(["x86_64", "aarch64"]), default="x86_64", show_default=True,
              help="The node's architecture: aarch64 is a Grace (arm64, sbsa) node, a GH200 by default "
                   "(needs a cross compiler and an aarch64 ldconfig; see docs/platforms.md).")
@click.option("--platform", type=click.Choice(["server", "wsl", "tegra"]), default="server", show_default=True,
              help="wsl: a WSL2 node (/dev/dxg and a Windows driver store); tegra: a Jetson board (arm64, "
                   "its CSV lists, for csv mode); see docs/platforms.md.")
def node_command(directory, driver_version, gpus, mig, topology, device_nodes, force, arch, platform):
    """Build a simulated GPU node in DIRECTORY (driver root, dev root and DIRECTORY/proc)."""
    if platform == "tegra":
        from nvct.simulate.tegra import build_tegra_node

        m = build_tegra_node(directory, device_nodes=device_nodes)
        summary = (f"simulated Jetson (Tegra) board at {m['roots']['driver_root']}: {len(m['devices'])} device "
                   f"nodes, {len(m['files'])} files, CSV lists in {m['mount_spec_path']}")
    elif platform == "wsl":
        from nvct.simulate.wsl import build_wsl_node

        m = build_wsl_node(directory, device_nodes=device_nodes)
        summary = (f"simulated WSL2 node at {m['roots']['driver_root']}: /dev/dxg, driver store "
                   f"{m['driver_store']}, {len(m['injected'])} files a container gets")
    else:
        m = build_node(directory, driver_version=driver_version, topology=topology, gpus=gpus, mig=mig,
                       device_nodes=device_nodes, force=force, arch=arch)
        models = sorted({g["model"] for g in m["gpus"]})
        migs = sum(len(g["mig_devices"]) for g in m["gpus"])
        kind = "" if m["arch"] == "x86_64" else f"{m['arch']} "
        summary = (f"simulated {kind}node at {m['roots']['driver_root']}: {len(m['gpus'])} x {', '.join(models)}, "
                   f"{migs} MIG device(s), driver {m['driver_version']}, CUDA {m['cuda_version']}, "
                   f"{len(m['libraries'])} libraries, {len(m['device_nodes'])} device nodes")
    click.echo(summary)
    click.echo(f"config: {m['config']}")
