"""The runtime shim as a process: passthrough, argv untouched, errors where docker shows them."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.base import parsecache
from nvct.edits.model import HOOK_ENV
from tests.support.fixtures import need_root, rootfs  # noqa: F401 - fixtures
from tests.support.legacy_front import Front, age, request_specs, shim_env, write_spec

BIN = os.path.dirname(sys.executable)
SHIM = os.path.join(BIN, "nvidia-container-runtime")
HEAVY = ("click", "tomlkit", "yaml", "elftools", "nvct.discover.nvml", "ctypes", "dataclasses", "logging")


@pytest.fixture
def fake_runc(tmp_path):
    """A low-level runtime that records its argv and exits 0."""
    script = tmp_path / "fake-runc"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\n")
    script.chmod(0o755)
    return script


def _config(tmp_path, runtime, extra=""):
    path = tmp_path / "config.toml"
    path.write_text(f'[nvidia-container-runtime]\nruntimes = ["{runtime}"]\n{extra}')
    return str(path)


def _bundle(tmp_path, env):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    spec = {"ociVersion": "1.0.2-dev", "process": {"env": env, "args": ["true"]}, "root": {"path": "rootfs"}}
    (bundle / "config.json").write_text(json.dumps(spec))
    return bundle


def run_shim(args, config, cwd=None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVIDIA_CTK_CONFIG_FILE_PATH": config}
    return subprocess.run([SHIM, *args], env=env, cwd=cwd, capture_output=True, text=True)


@pytest.mark.parametrize("args", [["--version"], ["--root", "/r", "start", "x"], ["delete", "--force", "x"],
                                  ["state", "x"]])
def test_other_subcommands_exec_runtime_with_argv_unchanged(tmp_path, fake_runc, args):
    r = run_shim(args, _config(tmp_path, fake_runc))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().split() == args


def test_non_gpu_container_passes_through_with_spec_untouched(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    before = (bundle / "config.json").read_bytes()
    r = run_shim(["create", "--bundle", str(bundle), "c1"], _config(tmp_path, fake_runc))
    assert r.returncode == 0, r.stderr
    assert (bundle / "config.json").read_bytes() == before
    assert (tmp_path / "argv").read_text().split() == ["create", "--bundle", str(bundle), "c1"]


def test_passthrough_imports_nothing_heavy(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=void"])
    # The shim's exec is replaced (every exec* form), so the process lives on to list its modules.
    code = ("import os, sys; os.execv = os.execve = lambda *a: None; sys.argv = [%r];"
            "from nvct.programs.shim import main; main(['create', '--bundle', %r, 'x']);"
            "print('heavy:', *(m for m in %r if m in sys.modules))" % (SHIM, str(bundle), HEAVY))
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": _config(tmp_path, fake_runc), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["heavy:"]
    assert not (tmp_path / "argv").exists()  # the fake runtime never ran


def test_bundle_defaults_to_cwd(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=42"])
    r = run_shim(["create", "c1"], _config(tmp_path, fake_runc), cwd=bundle)
    assert r.returncode == 1
    # read from cwd's bundle
    assert "/proc/driver/nvidia/version: not found: the NVIDIA driver is not loaded" in r.stderr


def test_errors_go_to_stderr_runc_log_and_config_log(tmp_path, fake_runc):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=bogus"])
    log = tmp_path / "runc-log.json"
    debug = tmp_path / "nvct.log"
    config = _config(tmp_path, fake_runc, f'debug = "{debug}"\n')
    r = run_shim(["--log", str(log), "--log-format", "json", "create", "--bundle", str(bundle), "c1"], config)
    assert r.returncode == 1
    assert not (tmp_path / "argv").exists()  # the container was never created
    msg = "NVIDIA_DRIVER_CAPABILITIES: unknown capability 'bogus'"
    assert r.stderr.count("\n") == 1 and msg in r.stderr
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["level"] == "error" and msg in last["msg"] and last["time"].endswith("Z")
    assert msg in debug.read_text()


def test_bad_config_file_is_one_line_for_a_gpu_container(tmp_path, fake_runc):
    config = tmp_path / "config.toml"
    config.write_text("[nvidia-container-runtime\n")
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"nvidia-container-runtime: {config}: invalid TOML: line 1")
    assert not (tmp_path / "argv").exists()


@pytest.mark.parametrize("env, mounts, annotations", [
    (["NVIDIA_VISIBLE_DEVICES=0"], [], {}),
    (["PATH=/bin"], [{"destination": "/var/run/nvidia-container-devices/0", "source": "/dev/null"}], {}),
    (["PATH=/bin"], [], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
])
def test_bad_config_file_refuses_every_kind_of_gpu_request(tmp_path, fake_runc, env, mounts, annotations):
    config = tmp_path / "config.toml"
    config.write_text("[nvidia-container-runtime\n")
    bundle = _bundle(tmp_path, env)
    spec = json.loads((bundle / "config.json").read_text())
    spec.update(mounts=mounts, annotations=annotations)
    (bundle / "config.json").write_text(json.dumps(spec))
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 1 and "invalid TOML" in r.stderr, r.stderr
    assert not (tmp_path / "argv").exists()


def test_no_runtime_found_names_the_list(tmp_path):
    r = run_shim(["--version"], _config(tmp_path, "no-such-runc"))
    assert r.returncode == 1
    assert "nvidia-container-runtime.runtimes: none of ['no-such-runc'] found" in r.stderr


def test_legacy_mode_inserts_the_hook_once(tmp_path, fake_runc, sim_node):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0"])
    config = tmp_path / "config.toml"
    config.write_text(open(sim_node["config"]).read() +
                      f'\n[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["{fake_runc}"]\n')
    for _ in range(2):
        r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
        assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    [hook] = spec["hooks"]["prestart"]
    assert hook["path"] == os.path.join(BIN, "nvidia-container-runtime-hook")
    assert hook["args"] == ["nvidia-container-runtime-hook", "prestart"]
    assert hook["env"] == [*HOOK_ENV, "NVCT_GPU_REQUEST=1", f"NVIDIA_CTK_CONFIG_FILE_PATH={config}",
                           f"NVCT_CONFIG_DIGEST={parsecache.digest(config.read_bytes())}"]


def test_jit_cdi_mode_writes_devices_mounts_and_hides_env(tmp_path, fake_runc, sim_node):
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=1", "X=1"])
    config = tmp_path / "config.toml"
    config.write_text(open(sim_node["config"]).read() +
                      f'\n[nvidia-container-runtime]\nmode = "jit-cdi"\nruntimes = ["{fake_runc}"]\n')
    r = run_shim(["create", "--bundle", str(bundle), "c1"], str(config))
    assert r.returncode == 0, r.stderr
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "X=1"]
    assert "/dev/nvidia1" in [d["path"] for d in spec["linux"]["devices"]]
    allowed = spec["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 195, "minor": 1, "access": "rwm"} in allowed
    [hook] = spec["hooks"]["createContainer"]
    assert os.path.isabs(hook["path"]) and hook["args"][:3] == ["nvct", "hook", "chain"]
    assert spec["ociVersion"] == "1.0.2-dev" and spec["root"] == {"path": "rootfs"}


def _needs_root():
    need_root("the runtime cache in /run/nvct is root-only")


def _recording_runtime(tmp_path, name):
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\necho {name} \"$@\" > {tmp_path}/argv\n")
    script.chmod(0o755)
    return script


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The config files of a migrating node: nvct's own (`nvct config default`) and the reference's
#: default config.toml. Both set annotation-prefixes = ["cdi.k8s.io/"].
SHIPPED = os.path.join(REPO, "config", "config.toml")
REFERENCE = os.path.join(REPO, "tests", "perf", "reference-config.toml")
CONFIGS = {
    "shipped": lambda rt: open(SHIPPED).read().replace('runtimes = ["runc", "crun"]', f'runtimes = ["{rt}"]'),
    "reference": lambda rt: open(REFERENCE).read().replace('runtimes = ["docker-runc", "runc", "crun"]',
                                                           f'runtimes = ["{rt}"]'),
    "swarm and prefixes": lambda rt: (f'swarm-resource = "DOCKER_RESOURCE_GPU, ALT_GPU"\n'
                                      f'[nvidia-container-runtime]\nruntimes = ["{rt}"]\n'
                                      '[nvidia-container-runtime.modes.cdi]\n'
                                      'annotation-prefixes = ["x.io/", "a.b*[c]^$/", "ü/"]\n'),
    "an empty prefix": lambda rt: (f'[nvidia-container-runtime]\nruntimes = ["{rt}"]\n'
                                   '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = [""]\n'),
    "a prefix with a newline": lambda rt: (f'[nvidia-container-runtime]\nruntimes = ["{rt}"]\n'
                                           '[nvidia-container-runtime.modes.cdi]\nannotation-prefixes = ["a\\nb/"]\n'),
}


def _recorded_front(tmp_path, text, directory="bin"):
    """A witness front (tests.support.legacy_front) and a config of ``text`` that its Python recorded,
    every call in a mount namespace of its own with a private /run (``front.run``): no other test's
    config pushes this one's line out of the record."""
    _needs_root()
    front = Front(tmp_path / directory)
    front.run = str(tmp_path / "run")
    os.makedirs(front.run, exist_ok=True)
    config = str(tmp_path / "config.toml")
    with open(config, "w") as f:
        f.write(text)
    age(config)
    record(front, config)
    return front, config


def _private(front, argv):
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /run && exec "$@"',
            front.run, *argv]


def record(front, config):
    """Have Python record ``config`` until its line is trusted (a config written within the last
    tick of the file clock is recorded untrusted: nvct.oci.runtime.identity)."""
    for _ in range(20):
        subprocess.run(_private(front, [front.shim, "state", "nvct-prime"]), env=shim_env(config),
                       capture_output=True, timeout=60)
        with open(os.path.join(front.run, "nvct", "runtimes")) as f:
            if any(line.startswith(config + "\t") and line.split("\t")[2][:1].isdigit() for line in f):
                return
    raise AssertionError(f"{config}: never recorded")


def _front_run(front, config, args, cwd=None):
    """``args`` through the front: (result, Python starts it took)."""
    before = front.starts()["shim"]
    r = subprocess.run(_private(front, [front.shim, *args]), env=shim_env(config), cwd=cwd, capture_output=True,
                       text=True, timeout=60)
    return r, front.starts()["shim"] - before


def _spec_bundle(directory, spec):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(json.dumps(spec, separators=(",", ":")))
    return str(directory)


def test_calls_other_than_create_skip_python_while_the_config_is_unchanged(tmp_path):
    front, config = _recorded_front(tmp_path, CONFIGS["shipped"](_recording_runtime(tmp_path, "runc")))
    for args in (["--root", "/r", "start", "c1"], ["delete", "--force", "c1"], ["--version"], ["state", "c1"]):
        r, starts = _front_run(front, config, args)
        assert (r.returncode, starts) == (0, 0), r.stderr
        assert (tmp_path / "argv").read_text().split() == ["runc", *args]


@pytest.mark.parametrize("how", ["a symlink", "not root's", "in a /run/nvct not root's"])
def test_the_front_sources_no_record_but_roots_own(tmp_path, how):
    """The front sources /run/nvct/fronts (sh that Python wrote): one that is a symlink, or not
    root's, or in a /run/nvct that is not root's, is never run; the call goes to Python."""
    front, config = _recorded_front(tmp_path, CONFIGS["shipped"](_recording_runtime(tmp_path, "runc")))
    top = os.path.join(front.run, "nvct")
    fronts = os.path.join(top, "fronts")
    witness = tmp_path / "sourced"
    evil = _recording_runtime(tmp_path, "evil")
    with open(fronts) as f:
        planted = f"touch {witness}\n" + f.read().replace(str(tmp_path / "runc"), str(evil))
    if how == "a symlink":
        os.unlink(fronts)
        (tmp_path / "planted").write_text(planted)
        os.symlink(tmp_path / "planted", fronts)
    else:
        with open(fronts, "w") as f:
            f.write(planted)
        os.chown(top if how.startswith("in") else fronts, 65534, 65534)
    r, starts = _front_run(front, config, ["state", "c1"])
    assert not witness.exists() and (r.returncode, starts) == (0, 1), r.stderr
    assert (tmp_path / "argv").read_text().split() == ["runc", "state", "c1"]


def _copy_keeping_mtime(src, dst, how):
    """``cp -p`` (in place: same inode) or ``rsync -t`` (a new file renamed over it), both keeping the mtime."""
    st = os.stat(dst)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    if how == "cp -p":
        subprocess.run(["cp", "-p", src, dst], check=True)
    else:
        tmp = dst + ".tmp-rsync"
        subprocess.run(["cp", "-p", src, tmp], check=True)
        os.rename(tmp, dst)
    assert os.stat(dst).st_mtime_ns == st.st_mtime_ns and os.stat(dst).st_size == st.st_size


@pytest.mark.parametrize("how", ["cp -p", "rsync -t"])
def test_a_config_replaced_keeping_its_mtime_takes_effect_on_the_very_next_call(tmp_path, how):
    """Finding 5 of issue 22: the front kept exec'ing the runtime the old config named."""
    old, new = _recording_runtime(tmp_path, "old-runc"), _recording_runtime(tmp_path, "new-runc")
    front, config = _recorded_front(tmp_path, _config_text(old))
    bundle = _spec_bundle(tmp_path / "plain", {"process": {"env": ["PATH=/bin"]}, "root": {"path": "rootfs"}})
    assert _front_run(front, config, ["state", "c1"])[1] == 0
    replacement = tmp_path / "replacement.toml"
    replacement.write_text(_config_text(new))  # the same size: only the identity tells them apart
    _copy_keeping_mtime(str(replacement), config, how)
    for args in (["state", "c1"], ["create", "--bundle", bundle, "c2"], ["delete", "c1"]):
        r, _ = _front_run(front, config, args)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().split() == ["new-runc", *args]


def _config_text(runtime):
    return f'[nvidia-container-runtime]\nruntimes = ["{runtime}"]\n'


@pytest.mark.parametrize("seconds", [60, 0])  # an old config (cached), one written just now (never cached)
def test_an_edited_runtimes_list_takes_effect_on_the_very_next_call(tmp_path, seconds):
    _needs_root()
    old, new = _recording_runtime(tmp_path, "old-runc"), _recording_runtime(tmp_path, "new-runc")
    config = _config(tmp_path, old)
    age(config, seconds)
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    assert run_shim(["create", "--bundle", str(bundle), "c1"], config).returncode == 0
    assert run_shim(["state", "c1"], config).returncode == 0
    assert (tmp_path / "argv").read_text().split() == ["old-runc", "state", "c1"]
    _config(tmp_path, new)
    for args in (["state", "c1"], ["delete", "c1"], ["--version"]):
        r = run_shim(args, config)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().split() == ["new-runc", *args]


def test_a_broken_config_keeps_the_runtime_its_containers_were_created_with(tmp_path, fake_runc):
    _needs_root()
    config = _config(tmp_path, fake_runc)
    bundle = _bundle(tmp_path, ["PATH=/bin"])
    assert run_shim(["create", "--bundle", str(bundle), "c1"], config).returncode == 0
    with open(config, "w") as f:
        f.write("[nvidia-container-runtime\n")
    for args in (["create", "--bundle", str(bundle), "c2"], ["start", "c1"], ["delete", "--force", "c1"]):
        r = run_shim(args, config)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().split() == args
        assert r.stderr == (f"nvidia-container-runtime: warning: {config}: invalid TOML: line 1, column 26: "
                            f"{r.stderr.split('column 26: ')[1].split(';')[0]}; running {fake_runc} "
                            "without GPU support\n")


@pytest.mark.parametrize("name", ["shipped", "reference", "swarm and prefixes"])
def test_a_create_that_asks_for_no_gpu_skips_python_with_any_config(tmp_path, name):
    """Issue 28: the shipped and the reference's default config set annotation-prefixes, and every
    create went through Python. The strings the front greps for are the ones Python recorded."""
    front, config = _recorded_front(tmp_path, CONFIGS[name](_recording_runtime(tmp_path, "runc")))
    bundle = _spec_bundle(tmp_path / "plain", {"process": {"env": ["PATH=/bin", "DOCKER_RESOURCE=1"]},
                                               "annotations": {"io.kubernetes.pod": "x", "cdi.k8s.io": "no slash"},
                                               "root": {"path": "rootfs"}})
    for args in (["--root", "/r", "create", "--bundle", bundle, "c2"],
                 ["create", "--pid-file", "/p", f"--bundle={bundle}", "c2"],
                 ["run", "-b", bundle, "--preserve-fds", "1", "c2"]):
        r, starts = _front_run(front, config, args)
        assert (r.returncode, starts) == (0, 0), r.stderr
        assert (tmp_path / "argv").read_text().split() == ["runc", *args]
    r, starts = _front_run(front, config, ["create", "c3"], cwd=bundle)  # the bundle defaults to the cwd
    assert (r.returncode, starts) == (0, 0), r.stderr


_MAYBE = [
    (["NVIDIA_VISIBLE_DEVICES=all"], {}), (["CUDA_VERSION=12.4"], {}),
    (["\\u004eVIDIA_VISIBLE_DEVICES=all"], {}),  # a request hidden by a JSON escape
    ([], {"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}),
]


@pytest.mark.parametrize("env, annotations", _MAYBE)
def test_a_create_that_may_ask_for_a_gpu_goes_to_python(tmp_path, env, annotations):
    front, config = _recorded_front(tmp_path, CONFIGS["reference"](_recording_runtime(tmp_path, "runc")))
    spec = {"process": {"env": env, "args": ["true"]}, "root": {"path": "rootfs"}, "annotations": annotations}
    gpu = _spec_bundle(tmp_path / "gpu", spec)
    with open(os.path.join(gpu, "config.json"), "w") as f:
        f.write(json.dumps(spec).replace("\\\\u004e", "\\u004e"))
    r, starts = _front_run(front, config, ["create", "--bundle", gpu, "c2"])
    assert starts == 1


@pytest.mark.parametrize("spec", [
    {"process": {"env": ["DOCKER_RESOURCE_GPU=0"]}}, {"process": {"env": ["ALT_GPU=0"]}},
    {"annotations": {"x.io/gpu": "nvidia.com/gpu=0"}}, {"annotations": {"a.b*[c]^$/x": "y"}},
    {"annotations": {"ü/x": "y"}},
])
def test_the_names_a_config_adds_send_create_to_python(tmp_path, spec):
    front, config = _recorded_front(tmp_path, CONFIGS["swarm and prefixes"](_recording_runtime(tmp_path, "runc")))
    bundle = _spec_bundle(tmp_path / "b", {"root": {"path": "rootfs"}, **spec})
    with open(os.path.join(bundle, "config.json"), "w") as f:
        f.write(json.dumps({"root": {"path": "rootfs"}, **spec}, ensure_ascii=False))
    assert _front_run(front, config, ["create", "--bundle", bundle, "c2"])[1] == 1


def test_one_dash_global_flags_are_read_as_runc_reads_them(tmp_path):
    """``-log-format json create``: the sh front once took "json" for the subcommand and passed the
    create through untouched; a GPU create must reach Python."""
    front, config = _recorded_front(tmp_path, CONFIGS["shipped"](_recording_runtime(tmp_path, "runc")))
    gpu = _spec_bundle(tmp_path / "g", {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "root": {"path": "r"}})
    _, starts = _front_run(front, config, ["-root", "/r", "-log-format", "json", "create", "--bundle", gpu, "c2"])
    assert starts == 1
    r, starts = _front_run(front, config, ["-root", "/r", "-log-format", "json", "state", "c2"])
    assert (r.returncode, starts) == (0, 0)
    assert (tmp_path / "argv").read_text().split() == ["runc", "-root", "/r", "-log-format", "json", "state", "c2"]


def test_a_config_found_through_xdg_config_home_is_the_one_the_front_finds(tmp_path):
    """The front takes the config's path from the record (nvct.config.file.default_path_sh): with
    XDG_CONFIG_HOME ending in '/', its own copy once looked up another path, and every call took
    Python."""
    front, _ = _recorded_front(tmp_path, "")
    home = tmp_path / "xdg"
    config = home / "nvidia-container-runtime" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIGS["shipped"](_recording_runtime(tmp_path, "runc")))
    age(str(config))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_CONFIG_HOME": f"{home}/"}
    for _ in range(3):  # Python records it (trusted once the file's clock tick has passed)
        subprocess.run(_private(front, [front.shim, "state", "c1"]), env=env, capture_output=True, timeout=60)
    before = front.starts()["shim"]
    r = subprocess.run(_private(front, [front.shim, "state", "c1"]), env=env, capture_output=True, text=True,
                       timeout=60)
    assert (r.returncode, front.starts()["shim"] - before) == (0, 0), r.stderr
    assert (tmp_path / "argv").read_text().split() == ["runc", "state", "c1"]


@pytest.mark.parametrize("args", [["create", "-bundle", "{b}", "c2"], ["create", "--b", "{b}", "c2"],
                                  ["create", "-b={b}", "c2"], ["create", "--bundle"], ["create", "--bundle=", "c2"]])
def test_unusual_create_command_lines_are_read_as_python_reads_them(tmp_path, args):
    """Every spelling nvct.oci.runcargs takes, the front takes (it is written from it): the bundle it
    names (or the working directory, for none) is the one whose spec decides, the other is not read."""
    front, config = _recorded_front(tmp_path, CONFIGS["shipped"](_recording_runtime(tmp_path, "runc")))
    plain = _spec_bundle(tmp_path / "plain", {"process": {"env": ["PATH=/bin"]}, "root": {"path": "rootfs"}})
    gpu = _spec_bundle(tmp_path / "gpu", {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "root": {"path": "r"}})
    for named, other in ((plain, gpu), (gpu, plain)):
        argv = [a.format(b=named) for a in args]
        r, starts = _front_run(front, config, argv, cwd=other if "{b}" in "".join(args) else named)
        assert starts == (named == gpu), (argv, r.stderr)
        if named == plain:
            assert (tmp_path / "argv").read_text().split() == ["runc", *argv]


# Spec text drawn from pieces of every name a request may use: whole, cut, in other case, escaped.
_PIECES = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICE", "nvidia_visible_devices", "CUDA_VERSION", "CUDA_",
           "/var/run/nvidia-container-devices", "/var/run/nvidia-container-device", "cdi.k8s.io/", "cdi.k8s.io",
           "DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_GP", "ALT_GPU", "x.io/", "x.io", "a.b*[c]^$/", "a.b*[c]^$", "ü/",
           "u/", "a", "b/", "\\", "\\u004e", "=", "/", "\n", "\t", "é", "\x00", " "]
_SPECS = request_specs(_PIECES, 6)


#: Configs with a name a line of grep's pattern file cannot hold (a newline): the front sends every
#: create to Python there (nvct.oci.runtime._names_text), a superset of Python's "maybe".
_ROUGH = {"a prefix with a newline"}


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    """A witness front whose python3 only notes that it started, with each config of CONFIGS recorded."""
    _needs_root()
    out = {}
    for name, text in CONFIGS.items():
        d = tmp_path_factory.mktemp("front")
        front, config = _recorded_front(d, text(_recording_runtime(d, "runc")))
        with open(os.path.join(front.dir, "python3"), "w") as f:
            f.write(f'#!/bin/sh\necho started >> {front.log}\n')
        out[name] = (front, config, d)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_front_decides_as_python_on_any_spec(fronts, name):
    """The front passes a create through without Python exactly when nvct.request.container.might_request_gpu
    says the spec cannot ask for a GPU under that config (never a false no; no false maybe either)."""
    from nvct.config import file as config_mod
    from nvct.request import container as request

    front, config, d = fronts[name]
    loaded = config_mod.load(config)
    bundle = os.path.join(d, "bundle")
    os.makedirs(bundle, exist_ok=True)

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(spec=_SPECS, ascii_only=st.booleans())
    def check(spec, ascii_only):
        raw = write_spec(bundle, spec, ascii_only=ascii_only)
        before = len(open(front.log).read().splitlines())
        r = subprocess.run(_private(front, [front.shim, "create", "--bundle", bundle, "c1"]), env=shim_env(config),
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        went_to_python = len(open(front.log).read().splitlines()) > before
        maybe = request.might_request_gpu(raw, loaded)
        assert went_to_python or not maybe, raw  # a false "no GPU": a container without its GPU
        if name not in _ROUGH:
            assert went_to_python == maybe, raw

    check()


def test_a_shim_killed_at_any_point_leaves_no_temporary_file(tmp_path):
    """Issue 28: SIGKILL at random points of 100 Python shim runs (each under a config changed just
    before, so each writes its record, its parsed config and, in legacy mode, the spec), each
    followed by a normal start; in a private mount namespace with /run of its own, to count exactly."""
    _needs_root()
    run = tmp_path / "run"
    run.mkdir()
    code = _KILL_LOOP.format(front=str(tmp_path / "bin"), repo=REPO, tmp=str(tmp_path))
    script = 'mount --bind "$0" /run && exec "$@"'
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(run),
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    tries, failed, leftovers = json.loads(r.stdout.splitlines()[-1])
    assert (tries, failed, leftovers) == (100, 0, [])


_KILL_LOOP = r'''
import json, os, random, signal, subprocess, sys, time
sys.path.insert(0, {repo!r})
from tests.support.legacy_front import Front, shim_env
front = Front({front!r})
runtime = os.path.join({tmp!r}, "runc")
with open(runtime, "w") as f:
    f.write("#!/bin/sh\nexit 0\n")
os.chmod(runtime, 0o755)
config = os.path.join({tmp!r}, "config.toml")
bundle = os.path.join({tmp!r}, "bundle")
os.makedirs(bundle, exist_ok=True)
spec = ('{{"ociVersion":"1.0.2","process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"],"args":["true"]}},'
        '"root":{{"path":"rootfs"}}}}')
env = shim_env(config)
failed = 0
rng = random.Random(28)
for n in range(100):
    with open(config, "w") as f:
        f.write('[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["%s"]\n# %d\n'
                '[nvidia-container-cli]\nno-cgroups = true\n' % (runtime, n))  # no device rules: no driver
    then = time.time() - 60
    os.utime(config, (then, then))
    with open(os.path.join(bundle, "config.json"), "w") as f:
        f.write(spec)
    p = subprocess.Popen([front.shim, "create", "--bundle", bundle, "c%d" % n], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0, 0.15))  # the kill's random point, not a synchronisation
    p.send_signal(signal.SIGKILL)
    p.wait()
    with open(os.path.join(bundle, "config.json"), "w") as f:
        f.write(spec)
    if subprocess.run([front.shim, "create", "--bundle", bundle, "c%d" % n], env=env,
                      capture_output=True).returncode != 0:
        failed += 1
leftovers = sorted(os.path.join(top, f)[len("/run"):] for top, _, files in os.walk("/run/nvct") for f in files
                   if f.endswith(".tmp")) + sorted(f for f in os.listdir(bundle) if f.endswith(".tmp"))
print(json.dumps([n + 1, failed, leftovers]))
'''


def test_a_full_run_nvct_is_said_in_a_debug_line_and_leaves_nothing(tmp_path):
    """Issue 28: with /run full, every start paid Python silently and left temporaries behind."""
    _needs_root()
    runtime = _recording_runtime(tmp_path, "runc")
    log = tmp_path / "nvct.log"
    config = _config(tmp_path, runtime, f'debug = "{log}"\nlog-level = "debug"\n')
    age(config)
    script = ('mount -t tmpfs -o size=16k,mode=0700 nvct-full /run/nvct && '
              'head -c 1048576 /dev/zero > /run/nvct/fill 2>/dev/null; '
              'for n in 1 2 3; do "$0" state c1; done; find /run/nvct -type f')
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, SHIM],
                       env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": config},
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines()[-1:] == ["/run/nvct/fill"], r.stdout + r.stderr  # no other file, no temporary
    lines = [line for line in log.read_text().splitlines() if "cache not used" in line]
    assert len(lines) >= 3 and all("No space left on device" in line for line in lines), log.read_text()
    assert (tmp_path / "argv").read_text().split() == ["runc", "state", "c1"]


def test_a_create_left_to_the_shim_passes_signals_and_the_runtimes_status_on(tmp_path, sim_node, rootfs):
    """A create whose mask the shim does after the runtime's create (nvct.modifier.prepare.Plan.after_create)
    runs the runtime as its child: a SIGTERM the engine sends the shim reaches the runtime, whose exit
    status is the shim's; a failed create gets no mask and no delete."""
    import signal

    from tests.support.bundle import make_bundle
    from tests.support.gpu_runs import PATH_ENV, node_config
    from tests.support.proc import wait_for

    need_root()
    runtime = tmp_path / "runtime"
    runtime.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/argv\n"
                       f"trap 'echo TERM > {tmp_path}/got; exit 7' TERM\n"
                       f"touch {tmp_path}/ready\ni=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done\n")
    runtime.chmod(0o755)
    config = node_config(tmp_path, sim_node, mode="jit-cdi", runtime=str(runtime))
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["true"], env=[PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"])
    shim = subprocess.Popen([SHIM, "create", "--bundle", bundle, "--pid-file", str(tmp_path / "pid"), "c1"],
                            env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": config},
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "ready").exists() or shim.poll() is not None, "the runtime's create")
        assert (tmp_path / "ready").exists(), shim.communicate(timeout=30)
        shim.send_signal(signal.SIGTERM)
        _, err = shim.communicate(timeout=30)
    finally:
        if shim.poll() is None:
            shim.kill()
    assert shim.returncode == 7 and (tmp_path / "got").read_text() == "TERM\n", err
    assert (tmp_path / "argv").read_text().split()[:1] == ["create"]  # no delete: nothing was created
    spec = json.loads(open(os.path.join(bundle, "config.json")).read())
    assert not (spec.get("hooks") or {}).get("createContainer"), spec["hooks"]
