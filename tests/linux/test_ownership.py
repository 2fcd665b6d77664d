"""ownership: who besides the owners could change a file, the one rule for trees privileged programs run from."""

from __future__ import annotations

import os
import stat

from nvct.linux import ownership


def test_weakness_is_the_one_rule():
    def st(mode, uid=0, gid=0):
        return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    assert ownership.weakness(st(stat.S_IFREG | 0o755)) is None
    assert ownership.weakness(st(stat.S_IFREG | 0o646)) == "mode 0646, world-writable"
    assert ownership.weakness(st(stat.S_IFDIR | 0o775, gid=100)) == "mode 0775, group 100-writable"
    assert ownership.weakness(st(stat.S_IFREG | 0o644, uid=1000)) == "owned by uid 1000"
    assert ownership.weakness(st(stat.S_IFLNK | 0o777)) is None
    assert ownership.weakness(st(stat.S_IFIFO | 0o644)).startswith("not a file or directory")
    # /tmp above a path: nobody may rename another's entry in a sticky directory; inside the chain it counts
    assert ownership.weakness(st(stat.S_IFDIR | 0o1777), above=True) is None
    assert ownership.weakness(st(stat.S_IFDIR | 0o1777)) == "mode 1777, world-writable"
    assert ownership.weakness(st(stat.S_IFREG | 0o644, uid=1000), (0, 1000)) is None


def test_tree_weaknesses_names_each_loose_entry_below_and_not_through_links(tmp_path):
    me = (os.getuid(),)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "ok").write_text("")
    loose = tree / "sub" / "loose"
    loose.write_text("")
    loose.chmod(0o646)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "loose").write_text("")
    (outside / "loose").chmod(0o666)
    (tree / "link").symlink_to(outside)
    for path in (tree, tree / "sub", tree / "sub" / "ok"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert ownership.tree_weaknesses(str(tree), me) == [(str(loose), "mode 0646, world-writable")]
    tree.chmod(0o757)
    assert (str(tree), "mode 0757, world-writable") in ownership.tree_weaknesses(str(tree), me)


def test_ancestor_weaknesses_names_loose_directories_above_and_spares_sticky_ones(tmp_path):
    me = (os.getuid(),)
    sticky = tmp_path / "sticky"
    loose = sticky / "loose"
    (loose / "tight").mkdir(parents=True)
    sticky.chmod(0o1777)
    loose.chmod(0o777)
    (loose / "tight").chmod(0o700)
    found = ownership.ancestor_weaknesses(str(loose / "tight" / "program"), me)
    assert (str(loose), "mode 0777, world-writable") in found
    assert all(path != str(sticky) for path, _ in found)
    assert all(path != str(loose / "tight") for path, _ in found)
