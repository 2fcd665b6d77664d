from __future__ import annotations

import copy
import json
import os

import pytest

from nvct.simulate import topology
from nvct.simulate.topology import TopologyError, ci_cap_minor, gi_cap_minor

DGX_BUSES = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
             "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]


@pytest.fixture
def raw():
    return topology.load(None)[0]


def resolve(raw, **kw):
    return topology.resolve(raw, **kw)


def test_default_is_a_dgx_h100(raw):
    topo = resolve(raw)
    assert [g.minor for g in topo.gpus] == list(range(8))
    assert [g.bus_id for g in topo.gpus] == DGX_BUSES
    assert topo.gpus[0].nvml_bus_id == "00000000:1B:00.0"
    g = topo.gpus[0]
    assert (g.name, g.brand, g.architecture, g.cc_major, g.cc_minor) == ("NVIDIA H100 80GB HBM3", 14, 9, 9, 0)
    assert (g.pci_device_id, g.pci_subsystem_id) == (0x233010DE, 0x16C110DE)
    assert (g.memory_mib, g.reserved_mib, g.multiprocessors, g.cores) == (81559, 593, 132, 16896)
    assert g.uuid == "GPU-df222005-1a28-580c-823e-105777e89104"
    assert len({x.uuid for x in topo.gpus}) == 8


def test_default_mig_layout_matches_nvidia_smi_placement(raw):
    migs = resolve(raw).gpus[0].mig_devices
    assert [(m.index, m.gi, m.ci, m.profile) for m in migs] == [(0, 1, 0, "3g.40gb"), (1, 2, 0, "3g.40gb")]
    assert [(m.gi_cap_minor, m.ci_cap_minor) for m in migs] == [(12, 13), (21, 22)]
    assert [(m.placement_start, m.placement_size) for m in migs] == [(0, 4), (4, 4)]
    assert migs[0].name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert all(m.uuid.startswith("MIG-") for m in migs)


def test_resolution_is_deterministic(raw):
    a, b = resolve(raw), resolve(copy.deepcopy(raw))
    assert a == b and a.sha256 == b.sha256
    assert resolve(raw, mig=False).sha256 != a.sha256


def test_cap_minor_formula_matches_the_static_table():
    assert gi_cap_minor(0, 0) == 3 and ci_cap_minor(0, 0, 0) == 4
    assert gi_cap_minor(0, 1) == 12
    assert ci_cap_minor(31, 14, 7) == 4322


def test_mig_off_keeps_gpus_mig_capable(raw):
    topo = resolve(raw, mig=False)
    assert topo.mig_devices == []
    assert all(g.mig_capable and not g.mig_enabled for g in topo.gpus)


def test_fewer_gpus_keeps_the_first(raw):
    topo = resolve(raw, gpus=3)
    assert [g.bus_id for g in topo.gpus] == DGX_BUSES[:3]
    assert len(topo.mig_devices) == 2


def test_more_gpus_are_synthetic_with_minors_in_order(raw):
    topo = resolve(raw, gpus=64)
    assert [g.minor for g in topo.gpus] == list(range(64))
    assert [g.index for g in topo.gpus] == list(range(64))
    assert topo.gpus[0].bus_id == "0000:1b:00.0"
    assert topo.gpus[8].bus_id == "0001:1b:00.0"
    assert topo.gpus[63].bus_id == "0007:df:00.0"
    assert len({g.bus_id for g in topo.gpus}) == 64
    assert len({g.uuid for g in topo.gpus}) == 64
    assert topo.gpus[0].mig_enabled and not topo.gpus[1].mig_enabled


def test_persistence_mode_is_on_unless_a_gpu_says_off(raw):
    raw["gpus"][3]["persistence_mode"] = False
    assert [g.persistence_mode for g in resolve(raw).gpus] == [True] * 3 + [False] + [True] * 4


def test_index_follows_pci_order_not_minor(raw):
    raw["gpus"][0]["minor"], raw["gpus"][1]["minor"] = 1, 0
    topo = resolve(raw)
    assert [(g.index, g.minor) for g in topo.gpus[:2]] == [(0, 1), (1, 0)]
    assert topo.gpus[0].mig_devices[0].gi_cap_minor == gi_cap_minor(1, 1)


def test_seven_small_instances_fill_gi_7_to_13(raw):
    raw["gpus"][0]["mig"]["instances"] = ["1g.10gb"] * 7
    assert [m.gi for m in resolve(raw).gpus[0].mig_devices] == list(range(7, 14))


def test_highest_free_placement_is_taken(raw):
    raw["gpus"][0]["mig"]["instances"] = ["4g.40gb", "3g.40gb"]
    migs = resolve(raw).gpus[0].mig_devices
    assert [(m.gi, m.profile) for m in migs] == [(1, "4g.40gb"), (2, "3g.40gb")]


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["gpus"][0].update(bus_id="1b:00.0"), "gpus[0].bus_id: invalid PCI bus id"),
    (lambda r: r["gpus"][1].update(minor=0), "two GPUs have minor 0"),
    (lambda r: r["gpus"][1].update(bus_id="0000:1b:00.0"), "two GPUs have bus_id"),
    (lambda r: r["gpus"][0].update(minor=254), "gpus[0].minor: must be an integer in [0, 253]"),
    (lambda r: r["gpus"][0].update(model="A100"), "gpus[0].model: unknown model 'A100'"),
    (lambda r: r["gpus"][0].update(uuid="GPU-1"), "gpus[0].uuid: invalid GPU UUID"),
    (lambda r: r["gpus"][2].update(persistence_mode="off"), "gpus[2].persistence_mode: must be true or false"),
    (lambda r: r["gpus"][0]["mig"].update(instances=["9g.90gb"]), "unknown MIG profile '9g.90gb'"),
    (lambda r: r["gpus"][0]["mig"].update(instances=["3g.40gb"] * 3), "at most 2 instance(s) of 3g.40gb"),
    (lambda r: r["gpus"][0]["mig"].update(instances=["7g.80gb", "1g.10gb"]), "no free placement left"),
    (lambda r: r["gpus"][0].update(minor=40), "MIG needs a device minor <= 31"),
    (lambda r: r.update(gpus=[]), "needs at least one GPU"),
    (lambda r: r["models"]["H100-SXM5-80GB"].update(compute_capability="9"), "expected MAJOR.MINOR"),
])
def test_bad_topologies_name_the_key(raw, mutate, message):
    mutate(raw)
    with pytest.raises(TopologyError) as exc:
        resolve(raw)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_gpu_count_out_of_range(raw):
    with pytest.raises(TopologyError, match=r"number of GPUs must be in \[1, 254\]"):
        resolve(raw, gpus=0)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text('{"gpus": [\n  1,,\n]}')
    with pytest.raises(TopologyError, match=r"t\.json: invalid JSON: line 2"):
        topology.load(bad)
    with pytest.raises(TopologyError, match="topology file not found"):
        topology.load(tmp_path / "missing.json")
    bad.write_text("[]")
    with pytest.raises(TopologyError, match="must be a JSON object"):
        topology.load(bad)


def test_topology_file_round_trips(tmp_path, raw):
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(raw))
    loaded, source = topology.load(path)
    assert source == str(path)
    assert resolve(loaded) == resolve(raw)


def test_minimal_topology_gets_defaults():
    raw = {"models": {"T4": {"name": "Tesla T4", "pci_device_id": "0x1EB810DE", "architecture": 7,
                             "compute_capability": "7.5", "memory_mib": 15360, "multiprocessors": 40}},
           "gpus": [{"model": "T4", "minor": 0, "bus_id": "0000:3b:00.0"}]}
    g = resolve(raw).gpus[0]
    assert not g.mig_capable and g.max_mig_devices == 0
    assert g.uuid.startswith("GPU-") and g.cores == 40 * 128
    raw["gpus"][0]["mig"] = {"enabled": True}
    with pytest.raises(TopologyError, match="has no MIG profiles"):
        resolve(raw)


def test_graphics_profiles_by_their_constant_or_as_they_say():
    raw = topology.load(os.path.join(os.path.dirname(topology.__file__), "rtx-pro-6000.json"))[0]
    resolved = resolve(raw)
    assert {p.name for p in resolved.profiles["RTX-PRO-6000-BSE"] if p.gfx} == {
        "1g.24gb+gfx", "2g.48gb+gfx", "4g.96gb+gfx"}
    assert [(m.index, m.gi, m.profile, m.gfx) for m in resolved.gpus[0].mig_devices] == [
        (0, 1, "2g.48gb+gfx", True), (1, 5, "1g.24gb", False), (2, 6, "1g.24gb+gfx", True)]
    assert not any(p.gfx for p in resolve(topology.load(None)[0]).profiles["H100-SXM5-80GB"])
    raw["models"]["RTX-PRO-6000-BSE"]["mig"]["profiles"][1]["gfx"] = False  # a profile may say otherwise
    assert not resolve(raw).gpus[0].mig_devices[2].gfx
    raw["models"]["RTX-PRO-6000-BSE"]["mig"]["profiles"][1]["gfx"] = "yes"
    with pytest.raises(TopologyError, match=r"profiles\[1\]\.gfx: must be true or false"):
        resolve(raw)
