"""cdi.*: the spec directories hold valid specs made for this driver version and these GPUs."""

from __future__ import annotations

import os

import yaml

from nvct import doctor
from nvct.discover.driver import Driver

from .nodes import by_id, one, write


def _spec(node) -> str:
    return os.path.join(node.cdi_dir, "nvidia.yaml")


def _edit_spec(node, change) -> None:
    with open(_spec(node)) as f:
        raw = yaml.safe_load(f)
    change(raw)
    write(_spec(node), yaml.safe_dump(raw))


def test_a_spec_from_an_older_driver_is_stale(node, node535):
    root = node535["roots"]["driver_root"]
    node.write_cdi_spec(driver=Driver(root, root, os.path.join(root, "proc")))
    findings = node.doctor()
    fresh = by_id(findings, "cdi.fresh")
    assert [f.status for f in fresh] == ["warn", "fail"]
    assert fresh[0].seen.startswith(f"{_spec(node)} was generated for driver root {root}, but nvct's driver root")
    assert fresh[1].seen == f"{_spec(node)} was made for driver 535.161.08, the kernel module is 550.54.15"
    assert fresh[1].fix == f"nvct cdi generate --output {_spec(node)}"
    assert doctor.exit_code(findings) == 1


def test_a_spec_whose_host_paths_are_gone_fails(node):
    def rename(raw):
        mount = raw["containerEdits"]["mounts"][0]
        mount["hostPath"] = mount["hostPath"] + ".gone"

    _edit_spec(node, rename)
    fresh = one(node.doctor(), "cdi.fresh")
    assert fresh.status == "fail"
    assert fresh.seen.startswith(f"{_spec(node)}: 1 host path(s) do not exist, e.g. {node.dir}/")


def test_a_spec_naming_a_gpu_that_is_gone_fails(node):
    gone = "GPU-00000000-0000-0000-0000-000000000000"

    def swap(raw):
        device = next(d for d in raw["devices"] if d["name"].startswith("GPU-"))
        device["name"] = gone

    _edit_spec(node, swap)
    fresh = by_id(node.doctor(), "cdi.fresh")
    assert [f.status for f in fresh] == ["fail", "warn"]
    assert fresh[0].seen == f"{_spec(node)} names GPU(s) this node does not have: {gone.lower()}"
    assert fresh[1].seen.startswith(f"{_spec(node)} lacks GPU(s) ")


def test_device_numbers_that_differ_from_the_drivers_fail(node):
    def renumber(raw):
        device = next(d for d in raw["devices"] if d["name"] == "1")
        device["containerEdits"]["deviceNodes"][0]["minor"] = 9

    _edit_spec(node, renumber)
    fresh = one(node.doctor(), "cdi.fresh")
    assert fresh.status == "fail"
    assert "/dev/nvidia1 is 195:9 in the spec, 195:1 for the driver" in fresh.seen


def test_an_invalid_spec_fails_with_its_path(node):
    bad = os.path.join(node.cdi_dir, "broken.json")
    write(bad, '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}')
    specs = by_id(node.doctor(), "cdi.specs")
    assert specs[0].status == "fail" and specs[0].seen.startswith(f"{bad}: ")
    assert specs[0].fix.startswith(f"correct or remove {bad}")
    assert specs[-1].status == "ok"


def test_no_spec_is_information_unless_the_shim_is_in_cdi_mode(node):
    os.unlink(_spec(node))
    specs = one(node.doctor(), "cdi.specs")
    assert specs.status == "info" and specs.fix == f"nvct cdi generate --output {_spec(node)}"
    node.write_config(mode="cdi")
    specs = one(node.doctor(), "cdi.specs")
    # Every GPU container then fails (tests/doctor/test_verdicts.py).
    assert specs.status == "fail" and "but the shim is in cdi mode" in specs.seen


def test_spec_dirs_default_to_the_configs(node):
    findings = node.doctor(cdi_dirs=())
    assert one(findings, "cdi.specs").seen.startswith(f"1 NVIDIA spec(s) in {node.cdi_dir} ")


def test_mig_uuids_are_checked_when_deep(node):
    gone = "MIG-00000000-0000-0000-0000-000000000000"

    def swap(raw):
        next(d for d in raw["devices"] if d["name"].startswith("MIG-"))["name"] = gone

    _edit_spec(node, swap)
    assert one(node.doctor(), "cdi.fresh").status == "ok"
    fresh = one(node.doctor(deep=True), "cdi.fresh")
    assert fresh.status == "fail" and gone.lower() in fresh.seen


def test_a_spec_whose_hooks_lack_env_warns_with_the_fix(node):
    node.write_cdi_spec()
    assert one(node.doctor(), "cdi.hook-env").status == "ok"  # nvct's own specs fix every hook's env

    def stale(raw):  # as older versions of the reference (and of nvct) wrote them
        for hook in raw["containerEdits"]["hooks"]:
            del hook["env"]

    _edit_spec(node, stale)
    finding = one(node.doctor(), "cdi.hook-env")
    assert finding.status == "warn"
    assert finding.seen.startswith(f"{_spec(node)}: 1 hook(s) without env, e.g. ")
    assert "under runc it runs with the container's environment" in finding.seen
    assert f"nvct cdi transform root --from / --input {_spec(node)} --output {_spec(node)}" in finding.fix


def test_a_spec_mounting_a_host_directory_read_write_warns_with_the_fix(node):
    node.write_cdi_spec()
    assert one(node.doctor(), "cdi.writable-mounts").status == "ok"  # nvct's hook mounts the MPS dir

    def as_the_reference(raw):  # /tmp/nvidia-mps as a spec mount
        hook = raw["containerEdits"]["hooks"][0]
        step = hook["args"][hook["args"].index("bind-mount"):]
        raw["containerEdits"]["mounts"].append({"hostPath": step[2], "containerPath": step[4],
                                                "options": ["nosuid", "nodev", "bind"]})

    _edit_spec(node, as_the_reference)
    finding = one(node.doctor(), "cdi.writable-mounts")
    assert finding.status == "warn"
    assert finding.seen.startswith(f"{_spec(node)}: mounts host directory ")
    assert "read-write at /tmp/nvidia-mps (1 such mount(s)): CDI runtimes mount it before" in finding.seen
    assert finding.fix.startswith(f"nvct cdi generate --output {_spec(node)}")
