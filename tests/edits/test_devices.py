import pytest

from nvct.base.errors import RequestError
from nvct.config import file as config_mod
from nvct.discover.driver import Driver
from nvct.edits.devices import select


@pytest.fixture(scope="module")
def driver(sim_node):
    return Driver.from_config(config_mod.load(sim_node["config"]))


def test_every_id_form(driver, sim_node):
    gpus = sim_node["gpus"]
    sel = select(("1", gpus[2]["uuid"], gpus[3]["uuid"].upper(), "0000:9d:00.0", "00000000:C3:00.0",
                  "c3:00.0", "nvidia.com/gpu=6"), driver)
    assert [g.index for g in sel.gpus] == [1, 2, 3, 4, 5, 6]
    mig1 = gpus[0]["mig_devices"][1]["uuid"]
    sel = select(("0:0", mig1, "nvidia.com/gpu=0:0"), driver)
    assert [(g.index, m.index) for g, m in sel.migs] == [(0, 0), (0, 1)]
    assert [g.index for g in sel.all_parents()] == [0]


def test_all_is_every_gpu_and_every_mig_device(driver):
    sel = select(("all",), driver)
    assert len(sel.gpus) == 8
    assert len(sel.migs) == 2


def test_unknown_ids_name_the_id_and_what_exists(driver):
    with pytest.raises(RequestError,
                       match=r"NVIDIA_VISIBLE_DEVICES: unknown device '8' \(this node has GPUs 0-7 and 2 MIG"):
        select(("8",), driver)
    for bad in ("GPU-nope", "MIG-nope", "0:7", "1:0", "zz:00.0", "other.com/gpu=0"):
        with pytest.raises(RequestError, match=f"unknown device '{bad}'"):
            select((bad,), driver)
