"""nvct.edits.model: joining nvct's chains into one hook process."""

from __future__ import annotations

from nvct.edits.model import Chain, Hook, join_chains
from nvct.edits.steps import CreateSymlinks, MaskParams, UpdateLdcache

HEAD = ("nvct", "hook", "chain")
MAIN = Chain("createContainer", "/usr/bin/nvct", HEAD, (UpdateLdcache(("/usr/lib",)), MaskParams()), root="/r",
             reason="main")
LINKS = Chain("createContainer", "/usr/bin/nvct", HEAD, (CreateSymlinks((("../card1", "/dev/dri/by-path/x"),)),),
              root="/r", reason="links")


def test_adjacent_chains_of_one_program_and_root_run_as_one_hook_in_their_order():
    (joined,) = join_chains([MAIN, LINKS])
    assert joined.steps == MAIN.steps + LINKS.steps
    assert joined.reason == "main; links"


def test_a_foreign_hook_between_them_or_another_root_keeps_them_apart():
    foreign = Hook("createContainer", "/usr/bin/other", ("other",))
    prestart = Hook("prestart", "/usr/bin/other", ("other",))
    assert join_chains([MAIN, foreign, LINKS]) == [MAIN, foreign, LINKS]
    assert join_chains([MAIN, LINKS.replace(root="/elsewhere")]) == [MAIN, LINKS.replace(root="/elsewhere")]
    assert len(join_chains([MAIN, prestart, LINKS])) == 2  # another stage does not separate them
