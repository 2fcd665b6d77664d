"""csv mode's reading of a board (nvct.edits.csvmode) on the simulated Jetson, without containers."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import ConfigError
from nvct.discover.driver import Driver
from nvct.edits import csvmode
from tests.support.fixtures import skip


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    from nvct.simulate.tegra import build_tegra_node

    try:
        return build_tegra_node(tmp_path_factory.mktemp("tegra") / "board", device_nodes=False)
    except Exception as e:  # no arm64 compiler: the e2e tests need one and CI has it
        if os.environ.get("NVCT_CI_NO_SKIP"):
            raise
        skip(str(e))


def _driver(node) -> Driver:
    root = node["roots"]["driver_root"]
    return Driver(root, root, node["roots"]["proc_root"])


def test_lines_are_type_comma_path_and_the_rest_is_skipped(tmp_path):
    f = tmp_path / "drivers.csv"
    f.write_text("dev, /dev/nvmap\n  lib ,  /usr/lib/x.so  \n# comment\nbogus, /x\nsym,\ndir /nocomma\n"
                 "sym, /a,b\n\n")
    assert csvmode.parse(str(f)) == [("dev", "/dev/nvmap"), ("lib", "/usr/lib/x.so"), ("sym", "/a,b")]


def test_only_the_base_files_unless_csv_mounts_all(board):
    d = board["mount_spec_path"]
    assert [os.path.basename(p) for p in csvmode.csv_files(d)] == ["devices.csv", "drivers.csv"]
    assert [os.path.basename(p) for p in csvmode.csv_files(d, all_files=True)] == [
        "devices.csv", "drivers.csv", "extra.csv"]
    assert csvmode.csv_files(os.path.join(d, "absent")) == []


def test_an_unreadable_list_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        csvmode.parse(str(tmp_path / "none.csv"))


def test_links_resolve_in_the_driver_root_never_above_it(board):
    root = board["roots"]["driver_root"]
    links, real = csvmode.chain(root, "/usr/lib/aarch64-linux-gnu/libcuda.so")
    assert real == "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1.1"
    assert links == [("/usr/lib/aarch64-linux-gnu/libcuda.so", "nvidia/libcuda.so"),
                     ("/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so", "libcuda.so.1.1")]
    escape = os.path.join(root, "usr/lib/escape")
    os.symlink("../../../../../../../etc/passwd", escape)
    try:
        assert csvmode.chain(root, "/usr/lib/escape") is None  # /etc/passwd of the board: not there
    finally:
        os.unlink(escape)


def test_every_entry_becomes_an_edit(board):
    files = csvmode.csv_files(board["mount_spec_path"])
    edits = csvmode.container_edits(_driver(board), files, hook_path="/usr/bin/nvct")
    assert {m.container_path for m in edits.mounts} == (
        {f for f in board["files"] if not f.startswith("/lib/firmware/")} | set(board["directories"]))
    steps = edits.hooks[0].args
    for link, target in board["links"].items():
        assert f"{target}::{link}" in steps
    assert "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1" in steps  # the SONAME, entered in the ld cache


def test_the_fast_soname_reader_reads_arm64_libraries(board):
    from nvct.linux import elf

    root = board["roots"]["driver_root"]
    for path in board["files"]:
        if ".so" in path:
            host = os.path.join(root, path.lstrip("/"))
            assert elf.soname(host) == elf.read(host).soname is not None, path
