"""The simulated WSL2 node, and what nvct.edits.wsl reads from it (no containers)."""

from __future__ import annotations

import os

import pytest

from nvct.base.errors import DriverError, NvctError, RequestError
from nvct.discover.driver import Driver
from nvct.edits import wsl
from nvct.simulate.wsl import build_wsl_node


@pytest.fixture(scope="module")
def wsl_files(tmp_path_factory):
    return build_wsl_node(tmp_path_factory.mktemp("wsl") / "node", device_nodes=False)


def _driver(node) -> Driver:
    root = node["roots"]["driver_root"]
    return Driver(root, root, node["roots"]["proc_root"])


def test_the_driver_store_is_nvidias_folder_only(wsl_files):
    assert wsl.driver_stores(_driver(wsl_files)) == [wsl_files["driver_store"]]


def test_the_listed_files_are_found_store_first(wsl_files):
    found = dict(wsl.files(_driver(wsl_files)))
    assert set(found) == set(wsl_files["injected"])
    assert found["/usr/lib/wsl/lib/libdxcore.so"] == "/usr/lib/wsl/lib/libdxcore.so"
    assert not set(found) & set(wsl_files["not_injected"])


def test_without_dxg_the_node_is_not_wsl(wsl_files):
    driver = _driver(wsl_files)
    assert not wsl.is_wsl(driver)
    with pytest.raises(DriverError, match="WSL2: .*/dev/dxg: No such file"):
        wsl.dxg_node(driver)


def test_a_symlinked_store_file_is_resolved_in_the_driver_root(wsl_files, tmp_path):
    """A driver root's absolute link is the node's path, never the host's."""
    root = wsl_files["roots"]["driver_root"]
    lib = os.path.join(root, "usr/lib/wsl/lib/libdxcore.so")
    os.rename(lib, lib + ".real")
    os.symlink("/usr/lib/wsl/lib/libdxcore.so.real", lib)
    try:
        found = dict(wsl.files(_driver(wsl_files)))
        assert found["/usr/lib/wsl/lib/libdxcore.so"] == "/usr/lib/wsl/lib/libdxcore.so.real"
    finally:
        os.unlink(lib)
        os.rename(lib + ".real", lib)


def test_one_device_all():
    wsl.check_ids(["all"], "--device-id")
    with pytest.raises(RequestError, match="one device, all"):
        wsl.check_ids(["0"], "--device-id")


def test_the_fast_soname_reader_agrees_with_pyelftools(wsl_files):
    from nvct.linux import elf

    root = wsl_files["roots"]["driver_root"]
    for path in wsl_files["injected"]:
        host = os.path.join(root, path.lstrip("/"))
        try:
            expected = elf.read(host).soname
        except NvctError:  # not an ELF file
            expected = None
        if path.endswith("nvidia-smi"):
            expected = None  # an executable, not a shared library
        assert elf.soname(host) == expected, path
