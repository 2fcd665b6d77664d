"""``nvct explain`` against the real shim: what explain prints is what the shim writes.

For each mode, ``nvct explain --bundle B --json --diff`` runs first (it must
write nothing), then the real ``nvidia-container-runtime`` does ``create`` on
the same bundle with ``/bin/true`` as its low-level runtime, so config.json
holds exactly what the shim wrote. Devices, mounts, env and hooks are
compared, and explain's diff must be the diff of the real change.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess

import pytest

from nvct.doctor import explain
from tests.doctor.nodes import GpuNode, clean_env, entry_point, write
from tests.support.fixtures import (
    rootfs,  # noqa: F401 - fixtures
    skip,
)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> GpuNode:
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")
    return GpuNode(tmp_path_factory.mktemp("explain-cli"))


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> dict:
    directory = str(tmp_path_factory.mktemp("bin"))
    return {name: entry_point(name, directory) for name in ("nvct", "nvidia-container-runtime")}


def _config(node: GpuNode, tmp_path, mode: str) -> str:
    with open(node.config) as f:
        text = f.read()
    path = str(tmp_path / f"{mode}.toml")
    write(path, text.replace('mode = "auto"', f'mode = "{mode}"'))
    return path


def _bundle(tmp_path, env) -> str:
    bundle = str(tmp_path / "bundle")
    os.makedirs(os.path.join(bundle, "rootfs"))
    write(os.path.join(bundle, "config.json"), json.dumps(explain.spec_from_options(env)))
    return bundle


def _explain(bins, config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([bins["nvct"], "--config", config, "explain", *args], capture_output=True, text=True,
                          env=clean_env(), timeout=60)


def _hooks(spec: dict) -> list[tuple]:
    return [(stage, h["path"], tuple(h.get("args", ())), tuple(h.get("env", ())))
            for stage, hooks in (spec.get("hooks") or {}).items() for h in hooks]


@pytest.mark.parametrize("mode, device", [("legacy", "0"), ("jit-cdi", "0"), ("cdi", "nvidia.com/gpu=1"),
                                          ("auto", "0:1")])
def test_explain_shows_exactly_what_the_shim_writes(node, bins, tmp_path, mode, device):
    config = _config(node, tmp_path, mode)
    bundle = _bundle(tmp_path, [f"NVIDIA_VISIBLE_DEVICES={device}", "NVIDIA_DRIVER_CAPABILITIES=all"])
    with open(os.path.join(bundle, "config.json")) as f:
        before = json.load(f)
    shown = _explain(bins, config, "--bundle", bundle, "--json", "--diff")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    with open(os.path.join(bundle, "config.json")) as f:
        assert json.load(f) == before  # explain wrote nothing

    shim = subprocess.run([bins["nvidia-container-runtime"], "--root", str(tmp_path / "state"), "create",
                           "--bundle", bundle, "ctr-1"], capture_output=True, text=True, timeout=60,
                          env=clean_env(NVIDIA_CTK_CONFIG_FILE_PATH=config))
    assert shim.returncode == 0, shim.stderr
    with open(os.path.join(bundle, "config.json")) as f:
        written = json.load(f)

    edits = data["edits"]
    assert data["mode"] == ("cdi" if mode == "cdi" else "jit-cdi" if mode == "auto" else mode)
    devices = {(d["path"], d["type"], d["major"], d["minor"], d.get("fileMode"))
               for d in (written.get("linux") or {}).get("devices", [])}
    assert devices == {(d["path"], d["type"], d["major"], d["minor"], d.get("fileMode"))
                       for d in edits.get("deviceNodes", [])}
    mounts = {(m["destination"], m["source"], m["type"], tuple(m["options"])) for m in written["mounts"]}
    assert mounts == {(m["containerPath"], m["hostPath"], m["type"], tuple(m["options"]))
                      for m in edits.get("mounts", [])}
    assert set(edits.get("env", [])) <= set(written["process"]["env"])
    assert _hooks(written) == [(h["hookName"], h["path"], tuple(h.get("args", ())), tuple(h.get("env", ())))
                               for h in edits.get("hooks", [])]
    real_diff = "".join(difflib.unified_diff(json.dumps(before, indent=2).splitlines(keepends=True),
                                             json.dumps(written, indent=2).splitlines(keepends=True),
                                             "config.json", "config.json (as the shim writes it)"))
    assert data["diff"] == real_diff
    if mode == "legacy":
        # The hook does the rest inside the container: explain shows it too.
        assert data["inside"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
        assert all(m["reason"] for m in data["inside"]["mounts"])
    else:
        assert data["inside"] is None


def test_text_output_gives_the_mode_request_and_reasons(node, bins, tmp_path):
    shown = _explain(bins, node.config, "-e", "NVIDIA_VISIBLE_DEVICES=0")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "request:  devices 0 (from env); capabilities compute,utility"
    assert lines[1] == "mode:     jit-cdi (auto: devices requested by id, edits computed at create time)"
    assert f"    /dev/nvidia0 c 195:0 0666 <- {node.path('dev/nvidia0')}  # GPU 0 (GPU-" in shown.stdout


def test_a_container_that_would_not_start_exits_1(node, bins):
    shown = _explain(bins, node.config, "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "NVIDIA_REQUIRE_CUDA=cuda>=99.0")
    assert shown.returncode == 1
    assert "error:    the container would not start: unsatisfied condition: cuda>=99.0" in shown.stdout
    assert "earlier cuda container (this node's driver: 550.54.15, CUDA 12.4)" in shown.stdout


def test_explain_needs_a_bundle_or_env(node, bins):
    shown = _explain(bins, node.config)
    assert shown.returncode == 2 and "give --bundle DIR, or the container's env with -e K=V" in shown.stderr
    missing = _explain(bins, node.config, "--bundle", "/nonexistent/bundle")
    assert missing.returncode == 1
    assert missing.stderr == "nvct: /nonexistent/bundle/config.json: OCI spec not found\n"


@pytest.fixture(scope="module")
def real_node(tmp_path_factory) -> GpuNode:
    """A node whose config runs real containers (runc, nvct's hooks)."""
    if os.geteuid() != 0:
        skip("needs root (the simulated node's device nodes are made with mknod)")
    return GpuNode(tmp_path_factory.mktemp("explain-rewritten"), real=True)


@pytest.mark.containers
@pytest.mark.parametrize("mode, device", [("jit-cdi", "1"), ("cdi", "nvidia.com/gpu=1"), ("legacy", "1"),
                                          ("auto", "0:1"), ("auto", "nvidia.com/gpu=2")])
def test_explain_on_a_bundle_the_shim_rewrote_explains_the_original_request(real_node, bins, tmp_path, rootfs,
                                                                            mode, device):
    """After a real create (shim, then runc), config.json is the shim's output: explain recognises
    nvct's edits and explains the request the engine passed, as it did before the create."""
    from tests.support.bundle import make_bundle
    from tests.support.gpu_runs import PATH_ENV, need_runtime

    need_runtime("runc")
    config = _config(real_node, tmp_path, mode)
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh"], env=[PATH_ENV, f"NVIDIA_VISIBLE_DEVICES={device}"])
    first = _explain(bins, config, "--bundle", bundle, "--json")
    assert first.returncode == 0, first.stderr
    state = str(tmp_path / "state")
    with open(tmp_path / "create.err", "w") as err:  # the created container holds its stdio: no pipes
        created = subprocess.run([bins["nvidia-container-runtime"], "--root", state, "create", "--bundle", bundle,
                                  "explain-1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                 timeout=60, env=clean_env(NVIDIA_CTK_CONFIG_FILE_PATH=config))
    try:
        assert created.returncode == 0, (tmp_path / "create.err").read_text()
        again = _explain(bins, config, "--bundle", bundle, "--json")
        text = _explain(bins, config, "--bundle", bundle)
    finally:
        subprocess.run(["/usr/sbin/runc", "--root", state, "delete", "-f", "explain-1"], capture_output=True)
    assert again.returncode == 0, again.stderr
    before, after = json.loads(first.stdout), json.loads(again.stdout)
    assert before["rewritten"] == [] and after["rewritten"], after
    assert after["mode"] == before["mode"] and after["request"] == before["request"]
    for key, fields in (("deviceNodes", ("path", "major", "minor")), ("mounts", ("containerPath", "hostPath"))):
        assert {tuple(x[f] for f in fields) for x in after["edits"].get(key, [])} == \
               {tuple(x[f] for f in fields) for x in before["edits"].get(key, [])}, key
    if mode == "legacy":
        assert [h["path"] for h in after["edits"]["hooks"]] == [h["path"] for h in before["edits"]["hooks"]]
        assert after["inside"] == before["inside"]
    assert text.stdout.startswith("bundle:   already rewritten by nvct's shim"), text.stdout
    assert "no GPU requested" not in text.stdout
