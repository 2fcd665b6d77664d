"""nvct.doctor.explain: what the shim would do to a spec, computed by the shim's own code."""

from __future__ import annotations

import copy
import os

import pytest

from nvct.base.errors import RequestError
from nvct.config import file as config_mod
from nvct.doctor import explain, explainview, rewritten
from nvct.edits import build as injection
from nvct.modifier import modes
from nvct.request import container as request_mod
from tests.doctor.nodes import GpuNode
from tests.support.fixtures import skip


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> GpuNode:
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")
    return GpuNode(tmp_path_factory.mktemp("explain"))


def config_for(node: GpuNode, mode: str = "auto", **top) -> config_mod.Config:
    config = config_mod.load(node.config, env={})
    config.data["nvidia-container-runtime"]["mode"] = mode
    config.data.update(top)
    return config


def gpu_spec(*env: str, **options) -> dict:
    return explain.spec_from_options(env or ("NVIDIA_VISIBLE_DEVICES=0",), **options)


def shim_writes(spec: dict, config) -> dict:
    """What modes.modify (the shim) makes of a copy of ``spec``."""
    out = copy.deepcopy(spec)
    modes.modify(out, request_mod.from_spec(out, config), config)
    return out


def reasons(edits) -> list[str]:
    return [item.reason for item in edits.device_nodes + edits.mounts + edits.hooks]


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy", "cdi", "auto"])
def test_explain_changes_the_spec_exactly_as_the_shim_does(node, mode):
    spec = gpu_spec("NVIDIA_VISIBLE_DEVICES=0,1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video")
    before = copy.deepcopy(spec)
    config = config_for(node, mode)
    result = explain.explain(spec, config)
    assert result.error is None
    assert result.after == shim_writes(before, config)
    assert spec == before == result.before  # nothing of the caller's is changed


@pytest.mark.parametrize("mode", ["jit-cdi", "cdi"])
def test_with_a_bundle_explain_shows_the_chain_the_shim_does_itself_and_writes_nothing(node, tmp_path, mode):
    """The shim writes links and ld cache before the runtime (nvct.modifier.prepare); explain shows that spec."""
    from nvct.oci import spec as ocispec
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    rootfs = make_rootfs(str(tmp_path))
    request = "nvidia.com/gpu=0" if mode == "cdi" else "0"
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"], env=[f"NVIDIA_VISIBLE_DEVICES={request}"])
    spec = ocispec.load(str(bundle))
    before = sorted(os.walk(rootfs)), sorted(os.listdir(bundle))
    result = explain.explain(spec, config_for(node, mode), bundle=str(bundle))
    assert result.error is None, result.error
    hooks = result.after["hooks"]["createContainer"]
    assert len(hooks) == 1 and "disable-device-node-modification" in hooks[0]["args"]
    assert "update-ldcache" not in hooks[0]["args"]  # the mask alone (and in cdi mode GPU 0's /dev/dri links)
    [chain] = [h for h in result.edits.hooks if h.hook_name == "createContainer"]
    assert "on an engine's create the shim runs it after the runtime's create, no hook" in chain.reason
    assert (sorted(os.walk(rootfs)), sorted(os.listdir(bundle))) == before


def test_jit_cdi_gives_every_edit_its_reason(node):
    result = explain.explain(gpu_spec(), config_for(node, "jit-cdi"))
    assert result.mode == "jit-cdi" and result.why == "configured mode 'jit-cdi'"
    assert all(reasons(result.edits))
    assert result.edits.device_nodes[0].path == "/dev/nvidia0"
    assert result.edits.device_nodes[0].reason.startswith("GPU 0 (GPU-")
    assert result.env_reasons["NVIDIA_VISIBLE_DEVICES=void"].startswith("jit-cdi:")


def test_legacy_shows_the_hook_and_what_it_does_inside(node):
    config = config_for(node, "legacy")
    spec = gpu_spec()
    result = explain.explain(spec, config)
    assert [h.hook_name for h in result.edits.hooks] == ["prestart"]
    assert result.edits.hooks[0].path == node.stub("nvidia-container-runtime-hook")
    driver = node.driver()
    assert result.inside == injection.container_edits(request_mod.from_spec(spec, config), driver, config)
    assert all(reasons(result.inside))
    data = explainview.to_json(result)
    assert "the shim only inserts the prestart hook" in data["inside_note"]
    text = explainview.render_text(result)
    assert "the shim inserts:" in text and "the hook then does, inside the container at start" in text


def test_legacy_shows_what_proc_driver_nvidia_will_show(node):
    """Only the requested GPUs and MIG devices' files, as libnvidia-container masks it (nvct.modifier.legacy)."""
    gpus = node.manifest["gpus"]
    result = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=1,3"), config_for(node, "legacy"))
    assert result.inside_proc == ["params", "version", "registry", f"gpus/{gpus[1]['bus_id']}",
                                  f"gpus/{gpus[3]['bus_id']}"]
    mig = gpus[0]["mig_devices"][1]
    result = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=0:1"), config_for(node, "legacy"))
    gi = f"capabilities/gpu{gpus[0]['minor']}/mig/gi{mig['gi']}"
    assert result.inside_proc[3:] == [f"gpus/{gpus[0]['bus_id']}", f"{gi}/access", f"{gi}/ci{mig['ci']}/access"]
    assert explainview.to_json(result)["inside_proc"] == result.inside_proc
    assert f"/proc/driver/nvidia (a read-only tmpfs, when the kernel has it): params, version, registry, " \
        f"gpus/{gpus[0]['bus_id']}, {gi}/access" in explainview.render_text(result)


def test_legacy_with_an_nvidia_hook_already_there_changes_nothing(node):
    spec = gpu_spec()
    spec["hooks"] = {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}]}
    result = explain.explain(spec, config_for(node, "legacy"))
    rules = result.after["linux"].pop("resources")["devices"]  # the hook's nodes, for the runtime (issue 25)
    assert result.after == result.before and result.inside is None
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in rules
    assert "already present" in result.why


def test_cdi_mode_names_the_spec_file_and_device_of_each_edit(node):
    result = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"), config_for(node, "auto"))
    assert result.mode == "cdi" and result.why == "auto: every requested device is a CDI name"
    spec_file = os.path.join(node.cdi_dir, "nvidia.yaml")
    by_path = {n.path: n.reason for n in result.edits.device_nodes}
    assert by_path["/dev/nvidia1"] == f"CDI device nvidia.com/gpu=1 ({spec_file})"
    assert by_path["/dev/nvidiactl"] == f"common edits of CDI spec {spec_file}"
    assert all(reasons(result.edits))


def test_a_container_without_a_gpu_request_passes_through(node):
    result = explain.explain(gpu_spec("FOO=bar"), config_for(node))
    assert result.mode is None and result.after == result.before
    assert result.why == ("no GPU requested (NVIDIA_VISIBLE_DEVICES is not set): "
                          "the shim passes the container through untouched")
    assert "mode:     none: no GPU requested" in explainview.render_text(result)


def test_an_unprivileged_env_request_can_be_refused_by_config(node):
    config = config_for(node, **{"accept-nvidia-visible-devices-envvar-when-unprivileged": False})
    assert "ignored in an unprivileged container" in explain.explain(gpu_spec(), config).why
    privileged = explain.explain(gpu_spec(privileged=True), config)
    assert privileged.request.privileged and privileged.mode == "jit-cdi"


def test_devices_requested_as_volume_mounts(node):
    config = config_for(node, **{"accept-nvidia-visible-devices-as-volume-mounts": True})
    spec = explain.spec_from_options((), mounts=["/dev/null:/var/run/nvidia-container-devices/3"])
    result = explain.explain(spec, config)
    assert result.request.devices == ("3",) and result.request.source == "mounts"
    assert "/dev/nvidia3" in [n.path for n in result.edits.device_nodes]


def test_devices_requested_by_annotation_go_to_cdi_mode(node):
    spec = explain.spec_from_options((), annotations=["cdi.k8s.io/gpu=nvidia.com/gpu=2"])
    result = explain.explain(spec, config_for(node))
    assert result.mode == "cdi" and result.request.source == "annotations"


@pytest.mark.parametrize("mode, enforced", [("jit-cdi", "enforced by the shim"),
                                            ("legacy", "enforced by the prestart hook"),
                                            ("cdi", "not enforced in cdi mode")])
def test_requirements_say_which_condition_holds(node, mode, enforced):
    env = ("NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0" if mode == "cdi" else "NVIDIA_VISIBLE_DEVICES=0",
           "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=nvidia,driver>=550")
    result = explain.explain(gpu_spec(*env), config_for(node, mode))
    assert result.requirements_note == enforced
    assert result.requirements == [("NVIDIA_REQUIRE_CUDA", "cuda>=13.0 brand=nvidia,driver>=550",
                                    [[("cuda>=13.0", False)], [("brand=nvidia", True),
                                                               ("driver>=550", True)]])]
    assert result.error is None  # the second alternative holds


@pytest.mark.parametrize("mode", ["jit-cdi", "legacy"])
def test_an_unsatisfied_requirement_is_the_error_the_start_would_fail_with(node, mode):
    result = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=13.0"),
                             config_for(node, mode))
    assert result.error.startswith("unsatisfied condition: cuda>=13.0")
    assert "requirements (enforced by" in explainview.render_text(result)
    assert "FAILS (cuda>=13.0 fails)" in explainview.render_text(result)


def test_a_bad_request_is_the_error(node):
    result = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=warp"),
                             config_for(node))
    assert result.mode is None and "unknown capability 'warp'" in result.error
    unknown = explain.explain(gpu_spec("NVIDIA_VISIBLE_DEVICES=42"), config_for(node, "jit-cdi"))
    assert "unknown device '42'" in unknown.error


def test_the_diff_is_the_config_json_change(node):
    diff = explainview.spec_diff(explain.explain(gpu_spec(), config_for(node, "jit-cdi")))
    assert diff.startswith("--- config.json\n+++ config.json (as the shim writes it)\n")
    assert '-      "NVIDIA_VISIBLE_DEVICES=0"\n' in diff
    assert '+      "NVIDIA_VISIBLE_DEVICES=void"\n' in diff
    assert '+        "path": "/dev/nvidia0",\n' in diff


def test_json_carries_request_edits_and_reasons(node):
    data = explainview.to_json(explain.explain(gpu_spec(), config_for(node, "jit-cdi")), diff=True)
    assert data["mode"] == "jit-cdi" and data["configured_mode"] == "jit-cdi"
    assert data["request"]["devices"] == ["0"] and data["request"]["capabilities"] == ["compute", "utility"]
    assert all(d["reason"] for d in data["edits"]["deviceNodes"] + data["edits"]["mounts"] + data["edits"]["hooks"])
    assert data["edits"]["envReasons"]["NVIDIA_VISIBLE_DEVICES=void"]
    assert data["inside"] is None and data["diff"]


def test_spec_from_options_builds_what_an_engine_passes():
    spec = explain.spec_from_options(["A=1", "A=2", "B=x=y"], privileged=True, mounts=["/src:/dst"],
                                     annotations=["k=v"])
    assert spec["process"]["env"][1:] == ["A=2", "B=x=y"]
    assert "CAP_SYS_ADMIN" in spec["process"]["capabilities"]["bounding"]
    assert spec["mounts"] == [{"destination": "/dst", "type": "bind", "source": "/src", "options": ["rbind", "ro"]}]
    assert spec["annotations"] == {"k": "v"}
    base = {"process": {"env": ["A=0"], "capabilities": ["CAP_KILL"]}}
    merged = explain.spec_from_options(["A=1"], privileged=True, base=base)
    assert merged["process"] == {"env": ["A=1"], "capabilities": ["CAP_KILL", "CAP_SYS_ADMIN"]}
    assert base["process"]["env"] == ["A=0"]


@pytest.mark.parametrize("kwargs, message", [
    ({"env": ["NOEQUALS"]}, "-e 'NOEQUALS': expected KEY=VALUE"),
    ({"mounts": ["/only-source"]}, "--mount '/only-source': expected SRC:DST"),
    ({"annotations": ["=v"]}, "--annotation '=v': expected KEY=VALUE"),
])
def test_spec_from_options_rejects_malformed_options(kwargs, message):
    with pytest.raises(RequestError, match=message):
        explain.spec_from_options(**kwargs)


def test_a_void_that_nvct_did_not_set_is_the_request():
    """NVIDIA_VISIBLE_DEVICES=void from the engine (no nvct hook, node or params file): no GPU asked."""
    spec = gpu_spec("NVIDIA_VISIBLE_DEVICES=void")
    assert rewritten.unrewrite(spec, config_mod.Config(env={})) == (spec, [])


@pytest.mark.parametrize("value", ["0,3", "0:1", "none", "all"])
def test_unrewrite_finds_the_request_in_what_the_shim_wrote(node, value):
    """Without a bundle (the shim's spec edits only): the request whose edits the spec holds."""
    config = config_for(node, "jit-cdi")
    original = gpu_spec(f"NVIDIA_VISIBLE_DEVICES={value}")
    written = shim_writes(original, config)
    assert "NVIDIA_VISIBLE_DEVICES=void" in written["process"]["env"]
    spec, notes = rewritten.unrewrite(written, config)
    assert f"the request whose edits this spec holds: NVIDIA_VISIBLE_DEVICES={value}" in notes[-2]
    assert explain.explain(spec, config).edits.to_json() == explain.explain(original, config).edits.to_json()



@pytest.mark.parametrize("key, value", [("nvcdi-disable-hooks", ["all"]),
                                        ("nvcdi-feature-flags", ["disable-ipc-discoverer"])])
def test_unrewrite_builds_jit_cdi_edits_with_the_configs_nvcdi_choices(node, key, value):
    """explain builds jit-cdi's edits as the shim does, honouring nvcdi-disable-hooks and -feature-flags."""
    config = config_for(node, "jit-cdi")
    config.data["nvidia-container-runtime"].setdefault("modes", {}).setdefault("jit-cdi", {})[key] = value
    original = gpu_spec("NVIDIA_VISIBLE_DEVICES=0,3")
    written = shim_writes(original, config)
    spec, notes = rewritten.unrewrite(written, config)
    assert "the request whose edits this spec holds: NVIDIA_VISIBLE_DEVICES=0,3" in notes[-2]
    assert explain.explain(spec, config).edits.to_json() == explain.explain(original, config).edits.to_json()
