"""Run one GPU container through nvct's runtime shim and runc, and show what it got."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tests.support.bundle import make_bundle  # noqa: E402 - the checkout is on sys.path now
from tests.support.rootfs import make_rootfs  # noqa: E402 - the checkout is on sys.path now

BIN = os.path.dirname(sys.executable)
COMMAND = ("echo '== device nodes'; find /dev -type c -name 'nvidia*' | sort; "
           "echo '== libraries'; dlopen-probe libcuda.so.1 libnvidia-ml.so.1; "
           "echo '== nvidia-smi -L'; nvidia-smi -L")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", default="all", help="NVIDIA_VISIBLE_DEVICES (default: all)")
    parser.add_argument("--mode", default="jit-cdi", choices=("jit-cdi", "legacy"))
    parser.add_argument("--runtime", default="runc", choices=("runc", "crun"))
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("demo: needs root (device nodes, mounts, runc)", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="nvct-demo-")
    if os.path.exists("/proc/driver/nvidia/version"):
        print("demo: NVIDIA driver found: using this node's real GPUs")
        base = ""
    else:
        from nvct.simulate.node import build_node

        node = build_node(os.path.join(work, "node"))
        print(f"demo: no GPU here: built a simulated node ({len(node['gpus'])} x {node['gpus'][0]['model']}, "
              f"driver {node['driver_version']}) in {work}/node")
        with open(node["config"]) as f:
            base = f.read()
    config = os.path.join(work, "config.toml")
    with open(config, "w") as f:
        f.write(base + f'\n[nvidia-container-runtime]\nmode = "{opts.mode}"\nruntimes = ["{opts.runtime}"]\n')
    if opts.runtime == "crun":
        from tests.support import cgroupfix

        cgroupfix.ensure_crun_works()
    bundle = make_bundle(os.path.join(work, "bundle"), make_rootfs(work), ["sh", "-c", COMMAND],
                         env=["PATH=/usr/local/bin:/usr/bin:/bin", f"NVIDIA_VISIBLE_DEVICES={opts.devices}"])
    argv = [os.path.join(BIN, "nvidia-container-runtime"), "--root", os.path.join(work, "state"),
            "run", "--bundle", bundle, "nvct-demo"]
    print(f"demo: {' '.join(argv[:1])} run ({opts.mode} mode, {opts.runtime}), "
          f"NVIDIA_VISIBLE_DEVICES={opts.devices}\n")
    env = dict(os.environ, NVIDIA_CTK_CONFIG_FILE_PATH=config)
    rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode
    print(f"\ndemo: container exited with {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
