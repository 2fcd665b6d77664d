"""``nvidia-ctk-installer`` and ``nvidia-toolkit``: the GPU Operator's entry programs.

The operator's toolkit DaemonSet runs the reference image's installer by
name -- ``nvidia-toolkit /usr/local/nvidia`` in older releases (from its
entrypoint script, after ``sleep 5``), ``nvidia-ctk-installer`` in newer
ones -- configured by environment variables (``RUNTIME``, ``ROOT``,
``CONTAINERD_CONFIG``, ``CONTAINERD_SOCKET``, ``RUNTIME_CONFIG``,
``TOOLKIT_PID_FILE``, ``NVIDIA_DRIVER_ROOT``, ``CDI_ENABLED`` ...). Both are
``nvct toolkit install``, which reads the same variables (docs/installer.md).

An operand (``nvidia-toolkit DIR``) is the toolkit install directory.
The older entry also reads ``RUNTIME_ARGS``: extra flags, split on blanks.
The restart modes are the reference's defaults (docker and containerd
``signal``, cri-o ``systemd``): a node without systemd must not fail an
install that the reference completes.
"""

from __future__ import annotations

import os
import sys

from nvct.cli import main as nvct_main
from nvct.programs.version import banner


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0] or "nvidia-ctk-installer")
    if argv[:1] in (["--version"], ["-v"]):
        sys.stdout.write(banner("nvidia-ctk-installer"))
        return 0
    flags = []
    for arg in argv:
        if not arg.startswith("-") and _is_operand(argv, arg):
            flags += ["--toolkit-install-dir", arg]
        else:
            flags.append(arg)
    if prog == "nvidia-toolkit":
        flags += os.environ.get("RUNTIME_ARGS", "").split()

    return nvct_main(["toolkit", "install", *flags])


def _is_operand(argv: list[str], arg: str) -> bool:
    """An argument that is neither an option nor an option's value (``--runtime containerd``)."""
    i = argv.index(arg)
    if i == 0:
        return True
    before = argv[i - 1]
    return not (before.startswith("-") and "=" not in before and before not in _FLAGS)


#: The installer's options that take no value (so what follows them may be an operand).
_FLAGS = {"--no-daemon", "-n", "--no-runtime-config", "--debug", "--cdi-enabled", "--enable-cdi",
          "--accept-nvidia-visible-devices-as-volume-mounts", "--use-legacy-config", "--set-as-default",
          "--no-set-as-default", "--enable-cdi-in-runtime", "--no-enable-cdi-in-runtime", "--enable-nri-plugin"}
