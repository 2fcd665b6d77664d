"""apply: container edits written into an OCI spec the way a CDI-aware runtime writes them."""

from __future__ import annotations

from nvct.edits import apply
from nvct.edits.model import HOOK_ENV, ContainerEdits, DeviceNode, Hook, Mount


def test_apply_edits_cdi_semantics():
    spec = {"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
            "mounts": [{"destination": "/usr/bin/nvidia-smi", "source": "/old", "type": "bind"}],
            "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}]}}
    edits = ContainerEdits(
        env=["NVIDIA_VISIBLE_DEVICES=void"],
        device_nodes=[DeviceNode("/dev/nvidia0", 195, 0, file_mode=0o666)],
        mounts=[Mount("/host/nvidia-smi", "/usr/bin/nvidia-smi", "bind", ("ro", "rbind"))],
        hooks=[Hook("createContainer", "/usr/bin/nvct", ("nvct", "hook", "chain"))],
        additional_gids=[44])
    apply.apply_edits(spec, edits)
    assert spec["process"]["env"] == ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]
    assert spec["linux"]["devices"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666}]
    assert spec["linux"]["resources"]["devices"] == [
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"}]
    assert spec["mounts"] == [{"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": "/host/nvidia-smi",
                               "options": ["ro", "rbind"]}]
    assert spec["hooks"]["createContainer"] == [{"path": "/usr/bin/nvct", "args": ["nvct", "hook", "chain"],
                                                 "env": list(HOOK_ENV)}]
    assert spec["process"]["user"]["additionalGids"] == [44]


def test_hook_entry_is_the_oci_hook_without_the_stage():
    hook = Hook("prestart", "/usr/bin/nvidia-container-runtime-hook", ("hook", "prestart"), timeout=5)
    assert apply.hook_entry(hook) == {"path": "/usr/bin/nvidia-container-runtime-hook",
                                      "args": ["hook", "prestart"], "env": list(HOOK_ENV), "timeout": 5}
    assert hook.to_cdi()["hookName"] == "prestart"  # the hook itself is left as it was


def test_add_hook_appends_or_goes_first_and_takes_a_null_hooks():
    spec = {"hooks": None}
    apply.add_hook(spec, Hook("prestart", "/a"))
    apply.add_hook(spec, Hook("prestart", "/b"))
    apply.add_hook(spec, Hook("prestart", "/first"), first=True)
    apply.add_hook(spec, Hook("poststop", "/c"))
    assert [h["path"] for h in spec["hooks"]["prestart"]] == ["/first", "/a", "/b"]
    assert [h["path"] for h in spec["hooks"]["poststop"]] == ["/c"]
