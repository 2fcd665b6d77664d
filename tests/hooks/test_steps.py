"""nvct.hooks.steps: the one executor of the chain's steps."""

from __future__ import annotations

import pytest

from nvct.base.errors import NvctError
from nvct.edits import steps as kinds
from nvct.hooks import steps
from nvct.hooks.container import HookContext


def test_an_unknown_step_warns_and_the_rest_runs(capsys, tmp_path):
    (tmp_path / "root").mkdir()
    ctx = HookContext(rootfs=str(tmp_path / "root"))
    steps.run([kinds.Unknown("from-a-newer-nvct", ()), kinds.CreateSymlinks((("t", "/link"),))], ctx)
    assert "unknown hook 'from-a-newer-nvct', ignored" in capsys.readouterr().err
    assert (tmp_path / "root/link").is_symlink()


def test_an_invalid_step_fails_in_its_turn_with_its_one_line(tmp_path):
    (tmp_path / "root").mkdir()
    ctx = HookContext(rootfs=str(tmp_path / "root"))
    chain = kinds.parse(["create-symlinks", "--link", "a::/first", "--", "create-symlinks", "--link", "bad"])
    with pytest.raises(NvctError, match=r"^create-symlinks: invalid --link 'bad'"):
        steps.run(chain, ctx)
    assert (tmp_path / "root/first").is_symlink()  # the steps before it ran


def test_every_step_kind_has_its_runner():
    kinds_run = {k for k in kinds.Step.__subclasses__() if k is not kinds.Unknown}
    assert kinds_run <= set(steps._RUNNERS)
    assert all(callable(steps.runner(kind)) for kind in kinds_run)  # each imported only when its step runs
    assert set(steps.STEPS) == set(kinds.NAMES)
