"""Where ``nvct toolkit install`` puts things: all of it under ``<install-dir>/toolkit``.

::

    toolkit/
      nvidia-container-runtime           wrappers (sh): set the config and PATH,
      nvidia-container-runtime.cdi         set the rest aside, then exec the
      nvidia-container-runtime.legacy      Python on nvct; the runtimes exec the
      nvidia-container-runtime-hook        low-level runtime instead while the
      nvct                                 kernel module is not loaded
      nvidia-cdi-hook, nvidia-ctk,       the reference's other programs, by name
        nvidia-container-cli               (CDI specs, containerd's --gpus, scripts)
      .runtime/<version>/                what the wrappers run: the bundled Python
        lib/python/                        runtime (nvct.toolkit.python) and nvct with
                                           its dependencies; a new version per install
      .runtime/current                   -> <version> (what the wrappers now name)
      .config/nvidia-container-runtime/  config.toml (+ config.cdi.toml, config.legacy.toml)

Paths written into files are always the final ones, even while the tree is
being assembled in a staging directory beside it. Each install makes a new
``.runtime/<version>`` and only then switches the wrappers to it, one
``rename`` each, so a hook that starts during an upgrade runs either the old
complete runtime or the new complete one. Every entry is root's, directories
0755, files 0755 or 0644, whatever the installer's umask
(:mod:`nvct.toolkit.install`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SUBDIR = "toolkit"
RUNTIME = "nvidia-container-runtime"
HOOK = "nvidia-container-runtime-hook"
NVCT = "nvct"
#: Programs other than the runtimes, each a wrapper of the same name (as the reference's directory has).
TOOLS = (HOOK, NVCT, "nvidia-cdi-hook", "nvidia-ctk", "nvidia-container-cli")
#: The runtimes the installer adds: name suffix (``nvidia``, ``nvidia-cdi``...) -> mode its wrapper forces.
RUNTIME_MODES = {"": None, "cdi": "cdi", "legacy": "legacy"}
#: The entry point the wrappers run, inside the copied nvct package.
ENTRY = "nvct/toolkit/entry.py"
#: The versioned runtimes' directory inside the toolkit directory.
RUNTIMES_DIR = ".runtime"


@dataclass(frozen=True)
class Layout:
    """The paths of one installation, rooted at ``root`` (``<install-dir>/toolkit``)."""

    root: str
    #: The runtime directory's name under ``.runtime`` ("" before one is chosen).
    version: str = ""

    @classmethod
    def for_install_dir(cls, install_dir: str) -> "Layout":
        return cls(os.path.join(os.path.abspath(install_dir), SUBDIR))

    def moved(self, root: str) -> "Layout":
        """The same tree elsewhere (the staging directory it is built in)."""
        return Layout(root, self.version)

    def with_version(self, version: str) -> "Layout":
        return Layout(self.root, version)

    @property
    def runtimes_dir(self) -> str:
        return os.path.join(self.root, RUNTIMES_DIR)

    @property
    def runtime_dir(self) -> str:
        """``.runtime/<version>``: the interpreter (when bundled) and the copy of nvct."""
        return os.path.join(self.runtimes_dir, self.version or "current")

    @property
    def lib_dir(self) -> str:
        return os.path.join(self.root, "lib")

    @property
    def python_dir(self) -> str:
        return os.path.join(self.runtime_dir, "lib", "python")

    @property
    def entry(self) -> str:
        return os.path.join(self.python_dir, ENTRY)

    @property
    def config_dir(self) -> str:
        return os.path.join(self.root, ".config", "nvidia-container-runtime")

    def config(self, mode: str | None = None) -> str:
        """The config a wrapper points at: ``config.toml``, or ``config.<mode>.toml`` for a forced mode."""
        return os.path.join(self.config_dir, f"config.{mode}.toml" if mode else "config.toml")

    def runtime(self, suffix: str = "") -> str:
        """``nvidia-container-runtime``, or ``nvidia-container-runtime.<suffix>``."""
        return os.path.join(self.root, f"{RUNTIME}.{suffix}" if suffix else RUNTIME)

    @property
    def hook(self) -> str:
        return os.path.join(self.root, HOOK)

    @property
    def nvct(self) -> str:
        return os.path.join(self.root, NVCT)

    def tool(self, name: str) -> str:
        """One of :data:`TOOLS`."""
        return os.path.join(self.root, name)

    def runtimes(self, nvidia_name: str = "nvidia") -> dict[str, str]:
        """Runtime name -> wrapper, as the engine's config gets them (``nvidia``, ``nvidia-cdi``, ``nvidia-legacy``)."""
        return {(f"nvidia-{suffix}" if suffix else nvidia_name): self.runtime(suffix) for suffix in RUNTIME_MODES}
