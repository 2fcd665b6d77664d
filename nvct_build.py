"""Build steps (pyproject.toml's cmdclass): the launcher gets the runtime's ``--version`` lines.

``nvidia-container-runtime --version`` prints nvct's lines, then the low-level
runtime's: the sh front does it without a Python start, from the lines
:func:`nvct.programs.version.fill_launcher` writes into each copy of
nvct/scripts/launcher the build makes (the programs, and the package data the
toolkit's wrappers are made of). The checkout's own launcher has none: there
Python prints them.
"""

from __future__ import annotations

import os
import sys

from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

build_scripts = Distribution().get_command_class("build_scripts")  # not under setuptools.command in all


def _fill(paths) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nvct.programs.version import fill_launcher  # noqa: PLC0415 - the tree being built, put on the path above

    for path in paths:
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path) as f:
            text = f.read()
        filled = fill_launcher(text)
        if filled != text:
            with open(path, "w") as f:
                f.write(filled)


class BuildScripts(build_scripts):
    def run(self) -> None:
        super().run()
        _fill(os.path.join(self.build_dir, os.path.basename(s)) for s in self.scripts or ())


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):  # an editable install reads the checkout's
            _fill([os.path.join(self.build_lib, "nvct", "scripts", "launcher")])
