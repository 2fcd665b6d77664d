"""``--version`` in the reference's form, naming nvct and its version.

Support scripts and bug templates grep the reference's first line
(``NVIDIA Container Runtime version ...``), so that line keeps its words;
the ``commit:`` line, which for the reference names a git commit, names nvct.
"""

from __future__ import annotations

from nvct import __version__

#: The NVIDIA Container Toolkit release whose programs' interface nvct's follow: the version the
#: packages' Provides give nvidia-container-toolkit(-base) and libnvidia-container-tools.
REFERENCE_VERSION = "1.18.0"

#: The OCI runtime-spec version nvct writes (the reference prints its own after ``spec:``).
OCI_SPEC_VERSION = "1.2.0"

#: Program -> the name the reference's ``--version`` prints.
TITLES = {
    "nvidia-container-runtime": "NVIDIA Container Runtime",
    "nvidia-container-runtime-hook": "NVIDIA Container Runtime Hook",
    "nvidia-ctk": "NVIDIA Container Toolkit CLI",
    "nvidia-cdi-hook": "NVIDIA CDI Hook",
    "nvidia-ctk-installer": "NVIDIA Container Toolkit Installer",
}


def banner(program: str, *extra: str) -> str:
    """``<title> version <v>`` / ``commit: nvct <v>`` [/ extra lines], newline-terminated."""
    lines = [f"{TITLES[program]} version {__version__}", f"commit: nvct {__version__}", *extra]
    return "\n".join(lines) + "\n"


def runtime_banner() -> str:
    """The shim's header; the low-level runtime's own ``--version`` follows it."""
    return banner("nvidia-container-runtime", f"spec: {OCI_SPEC_VERSION}") + "\n"


#: nvct/scripts/launcher's line that each built copy gets :func:`runtime_banner` in (nvct_build.py).
LAUNCHER_BANNER = "nvct_banner=  # @banner@: filled in by the build\n"
#: The launcher's line for the variables apply-cuda-memory-limits reads (nvct.edits.steps).
LAUNCHER_MEMORY = "nvct_memory=  # @memory@: filled in by the build\n"


def fill_launcher(text: str) -> str:
    """The launcher ``text`` with :data:`LAUNCHER_BANNER` holding :func:`runtime_banner` and
    :data:`LAUNCHER_MEMORY` the memory-limit variables, for its sh fronts to use without a Python
    start; unchanged where the lines are not there."""
    from nvct.edits.steps import MEMORY_LIMIT, MEMORY_REQUEST  # build time only

    banner = "'" + runtime_banner().replace("'", "'\\''") + "'"
    memory = "'" + " ".join(MEMORY_REQUEST + MEMORY_LIMIT) + "'"
    return text.replace(LAUNCHER_BANNER, f"nvct_banner={banner}\n").replace(LAUNCHER_MEMORY, f"nvct_memory={memory}\n")


def container_cli_banner() -> str:
    """libnvidia-container's ``key: value`` lines; the library is nvct itself."""
    import platform

    return (f"cli-version: {__version__} (nvct)\n"
            f"lib-version: {__version__} (nvct)\n"
            f"build revision: nvct {__version__}\n"
            f"build platform: {platform.machine()}\n")
