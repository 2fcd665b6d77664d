"""Legacy mode without a Python start: the shim's sh front appends the recorded prestart hook.

Every case compares the front's config.json with the one the Python shim writes for the same
input, and counts Python starts with the witness of tests.support.legacy_front.
"""

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.base import parsecache
from nvct.edits.model import HOOK_ENV
from tests.support.fixtures import need_root
from tests.support.legacy_front import Front, age, legacy_config, prime, shim_env

SETKEY = {"path": "/proc/4242/exe", "args": ["libnetwork-setkey", "-exec-root=/var/run/docker", "0123abcd", "fe98"]}
#: Shapes of config.json the front edits itself (compact, as Go's encoder writes it).
SHAPES = {
    "no hooks": None,
    "docker's prestart hook": {"prestart": [SETKEY]},
    "empty hooks": {},
    "another stage only": {"createRuntime": [{"path": "/bin/true"}]},
    "empty prestart": {"prestart": []},
    "two hooks, brackets in strings": {
        "prestart": [{"path": "/bin/a", "args": ["a", "]x[", "{y}", "hooks:", "pre start"], "env": ["K=]"],
                      "timeout": 5}, {"path": "/bin/b"}],
        "poststop": [{"path": "/bin/c", "args": ["c", "}"]}]},
}


def _needs_root():
    need_root("the shim records its runtime and hook only as root")


@pytest.fixture(params=["/bin/sh", "/bin/bash --posix"])  # dash on Debian; bash is RHEL's /bin/sh
def front(tmp_path, request):
    _needs_root()
    runc = tmp_path / "fake-runc"
    runc.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\n")
    runc.chmod(0o755)
    front = Front(tmp_path / "bin", request.param)
    _privately(front, tmp_path / "run")
    front.config = legacy_config(tmp_path / "config.toml", str(runc))
    prime(front, front.config)
    return front


def _privately(front, run):
    """``front.shim`` becomes a program beside it that runs it in a mount namespace of its own whose
    /run is ``run``: what it records, no other test (or stale copy of nvct) rewrites or removes."""
    os.makedirs(run, exist_ok=True)
    wrapper = os.path.join(front.dir, "private-runtime")
    with open(wrapper, "w") as f:
        f.write(f"#!/bin/sh\nexec unshare -m --propagation private sh -c 'mount --bind \"$0\" /run && exec \"$@\"' "
                f"{run} {front.shim} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    front.real_shim, front.shim = front.shim, wrapper


def _spec(hooks, env=("NVIDIA_VISIBLE_DEVICES=0",), annotations=None):
    spec = {"ociVersion": "1.0.2-dev", "process": {"env": list(env), "args": ["true"], "cwd": "/"},
            "root": {"path": "rootfs"}, "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]}
    if hooks is not None:
        spec["hooks"] = copy.deepcopy(hooks)
    if annotations:
        spec["annotations"] = annotations
    return spec


def _bundle(directory, text):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        f.write(text)
    return str(directory)


def _compact(spec):
    return json.dumps(spec, separators=(",", ":"))


def _run(front, argv, cwd=None):
    env = shim_env(front.config)
    return subprocess.run([front.shim, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def _by_python(front, tmp_path, text, argv_before=()):
    """config.json as the Python shim writes it for ``text`` (the front's own exec line, run directly)."""
    bundle = _bundle(tmp_path / "by-python", text)
    env = shim_env(front.config)
    code = "import sys; sys.argv = sys.argv[1:]; from nvct.programs.shim import main; sys.exit(main(banner=False))"
    r = subprocess.run([sys.executable, "-I", "-c", code, front.real_shim, *argv_before, "create", "--bundle", bundle,
                        "c1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(bundle, "config.json")) as f:
        return json.load(f)


def _create(front, tmp_path, text, argv_before=(), name="bundle", keep=()):
    """The front's create of ``text``: (config.json after, Python starts it took)."""
    bundle = _bundle(tmp_path / name, text)
    before = front.starts()["shim"]
    r = _run(front, [*argv_before, "create", "--bundle", bundle, "c1"])
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(bundle)) == sorted(["config.json", *keep])  # nothing left beside it
    with open(os.path.join(bundle, "config.json")) as f:
        return json.load(f), front.starts()["shim"] - before


def _hook(front, log_format=None):
    with open(front.config, "rb") as f:
        digest = parsecache.digest(f.read())
    env = [*HOOK_ENV, "NVCT_GPU_REQUEST=1", f"NVIDIA_CTK_CONFIG_FILE_PATH={front.config}",
           f"NVCT_CONFIG_DIGEST={digest}"]
    if log_format:
        env.append(f"NVCT_LOG_FORMAT={log_format}")
    return {"path": front.hook, "args": ["nvidia-container-runtime-hook", "prestart"], "env": env}


@pytest.mark.parametrize("log_format", [None, "json", "text"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_gpu_create_gets_pythons_hook_without_a_python_start(front, tmp_path, shape, log_format):
    text = _compact(_spec(SHAPES[shape]))
    flags = ("--log-format", log_format) if log_format else ()
    got, starts = _create(front, tmp_path, text, flags)
    assert starts == 0
    expected = _spec(SHAPES[shape])
    expected.setdefault("hooks", {}).setdefault("prestart", []).append(_hook(front, log_format))
    assert got == expected
    assert os.stat(tmp_path / "bundle" / "config.json").st_mode & 0o777 == 0o600
    assert (tmp_path / "argv").read_text().split() == [*flags, "create", "--bundle", str(tmp_path / "bundle"), "c1"]
    assert got == _by_python(front, tmp_path, text, flags)


@pytest.mark.parametrize("argv", [["--log-format=json", "run", "-b", "{b}", "c1"],
                                  ["--root", "/r", "create", "--bundle={b}", "--pid-file", "/p", "c1"],
                                  ["create", "c1"]])  # the bundle is the cwd
def test_every_spelling_of_create_the_front_reads(front, tmp_path, argv):
    bundle = _bundle(tmp_path / "b", _compact(_spec(None)))
    r = _run(front, [a.format(b=bundle) for a in argv], cwd=bundle)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(bundle, "config.json")) as f:
        [hook] = json.load(f)["hooks"]["prestart"]
    assert hook == _hook(front, "json" if "--log-format=json" in argv else None)
    assert front.starts()["shim"] == 1  # the priming call only


def test_strings_that_look_like_structure_stay_strings(front, tmp_path):
    env = ["CUDA_VERSION=12.4", "X=hooks:{prestart:[", "Y=]}]}"]
    text = _compact(_spec(SHAPES["docker's prestart hook"], env, {"io.x/a": "{[", "io.x/hooks": "]prestart"}))
    got, starts = _create(front, tmp_path, text)
    assert starts == 0
    assert got == _by_python(front, tmp_path, text)
    assert got["hooks"]["prestart"] == [SETKEY, _hook(front)]


def test_a_spec_that_names_a_request_gets_the_hook_which_decides(front, tmp_path):
    """Python inserts nothing for ``void``; the front cannot tell, and the hook exits at once
    (tests/e2e/test_legacy_front.py runs it)."""
    text = _compact(_spec(None, ["NVIDIA_VISIBLE_DEVICES=void"]))
    got, starts = _create(front, tmp_path, text)
    assert starts == 0
    assert got["hooks"]["prestart"] == [_hook(front)]
    assert "hooks" not in _by_python(front, tmp_path, text)


def _go(spec):
    """``spec`` as Go's encoding/json writes it: compact, with &, < and > escaped."""
    return _compact(spec).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def test_escapes_go_writes_stay_as_they_are(front, tmp_path):
    """``sh -c 'a && b > c'`` comes as \\u0026 and \\u003e; quotes and backslashes escaped in strings."""
    args = ["sh", "-c", 'a && b > "c]" < d\\ ; echo "{[\\"hooks\\":{"']
    hooks = {"prestart": [{**SETKEY, "args": [*SETKEY["args"], 'x"]', "\\"]}]}
    spec = {**_spec(hooks), "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"], "args": args}}
    text = _go(spec)
    assert "\\u0026" in text and '\\"' in text
    got, starts = _create(front, tmp_path, text)
    assert starts == 0
    assert got["process"]["args"] == args
    assert got == _by_python(front, tmp_path, text)
    assert got["hooks"]["prestart"] == [hooks["prestart"][0], _hook(front)]


_STRING = st.text(alphabet="ab/=-_ ,:[]{}\"\\&<>", max_size=8)
_HOOK = st.fixed_dictionaries({"path": _STRING}, optional={
    "args": st.lists(_STRING, max_size=3), "env": st.lists(_STRING, max_size=3),
    "timeout": st.integers(0, 99)})
_HOOKS = st.dictionaries(st.sampled_from(["prestart", "createRuntime", "poststart", "poststop"]),
                         st.lists(_HOOK, max_size=3), max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hooks=st.one_of(st.none(), _HOOKS), env=st.lists(_STRING, max_size=3))
def test_any_hooks_the_front_takes_come_out_as_python_writes_them(front, tmp_path, hooks, env):
    if hooks is not None and "prestart" in hooks:  # Go's encoder writes prestart first
        hooks = {"prestart": hooks.pop("prestart"), **hooks}
    spec = _spec(hooks, ["NVIDIA_VISIBLE_DEVICES=0", *env])
    shutil.rmtree(tmp_path / "bundle", ignore_errors=True)
    got, starts = _create(front, tmp_path, _go(spec))
    assert starts == 0
    spec.setdefault("hooks", {}).setdefault("prestart", []).append(_hook(front))
    assert got == spec


_ODD = {
    "indented": lambda s: json.dumps(s, indent=2),
    "an escaped letter": lambda s: _compact(s).replace('"/proc"', '"/pro\\u0063"'),
    "a string that ends in \"hooks": lambda s: _compact({**s, "annotations": {"io.x/a": 'x"hooks'}}),
    "an NVIDIA hook already": lambda s: _compact({**s, "hooks": {"prestart": [_nvidia_hook()]}}),
    "prestart not first": lambda s: _compact({**s, "hooks": {"poststop": [SETKEY], "prestart": [SETKEY]}}),
    "prestart null": lambda s: _compact(s).replace('"hooks":{}', '"hooks":{"prestart":null}'),
    "hooks null": lambda s: _compact(s).replace('"hooks":{}', '"hooks":null'),
    "\"hooks\" as a string": lambda s: _compact({**s, "annotations": {"io.x/a": "hooks"}}),
    "\"prestart\" as a string": lambda s: _compact({**s, "annotations": {"io.x/a": "prestart"}}),
    "not an object": lambda s: "[" + _compact(s) + "]",
}


def _nvidia_hook():
    return {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}


@pytest.mark.parametrize("odd", list(_ODD))
def test_a_spec_the_front_cannot_edit_exactly_goes_to_python(front, tmp_path, odd):
    text = _ODD[odd](_spec({}))
    bundle = _bundle(tmp_path / "bundle", text)
    r = _run(front, ["create", "--bundle", bundle, "c1"])
    assert front.starts()["shim"] == 2, r.stderr  # priming + this create
    assert sorted(os.listdir(bundle)) == ["config.json"]
    if odd in ("not an object", "prestart null"):  # Python's one-line refusal
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "config.json" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    with open(os.path.join(bundle, "config.json")) as f:
        prestart = json.load(f)["hooks"]["prestart"]
    assert sum("nvidia-container-runtime-hook" in h["path"] for h in prestart) == 1


def _log_format_flag(front, tmp_path):
    return _run(front, ["--log-format", "yaml", "create", "--bundle",
                        _bundle(tmp_path / "bundle", _compact(_spec(None))), "c1"])


def test_an_unknown_log_format_goes_to_python(front, tmp_path):
    _log_format_flag(front, tmp_path)
    assert front.starts()["shim"] == 2


def test_an_edited_config_goes_to_python_which_records_again(front, tmp_path):
    with open(front.config, "a") as f:
        f.write("\n")
    age(front.config, 30)
    _create(front, tmp_path, _compact(_spec(None)))
    got, starts = _create(front, tmp_path, _compact(_spec(None)), name="again")
    assert (front.starts()["shim"], starts) == (2, 0)
    assert got["hooks"]["prestart"] == [_hook(front)]


def test_another_program_under_the_same_config_goes_to_python(front, tmp_path):
    other = Front(tmp_path / "other")
    _privately(other, tmp_path / "run")
    other.config = front.config
    bundle = _bundle(tmp_path / "bundle", _compact(_spec(None)))
    assert _run(other, ["create", "--bundle", bundle, "c1"]).returncode == 0
    assert other.starts()["shim"] == 1
    with open(os.path.join(bundle, "config.json")) as f:
        assert json.load(f)["hooks"]["prestart"] == [{**_hook(front), "path": other.hook}]


def test_a_hook_no_longer_executable_goes_to_python(front, tmp_path):
    os.chmod(front.hook, 0o644)
    _create(front, tmp_path, _compact(_spec(None)))
    assert front.starts()["shim"] == 2


@pytest.mark.parametrize("case", ["jit-cdi mode", "a log file", "a hook only PATH finds"])
def test_what_python_does_not_record(tmp_path, case):
    """Another mode; a log file (it gets the shim's line per start); a hook found on a PATH that the
    next caller may not share."""
    _needs_root()
    runc = shutil.which("true")
    front = Front(tmp_path / "bin")
    _privately(front, tmp_path / "run")
    if case == "a hook only PATH finds":
        os.unlink(front.hook)
    extra = f'debug = "{tmp_path}/shim.log"\n' if case == "a log file" else ""
    mode = "jit-cdi" if case == "jit-cdi mode" else "legacy"
    front.config = legacy_config(tmp_path / "config.toml", runc, extra=extra, mode=mode)
    prime(front, front.config)
    with open(tmp_path / "run" / "nvct" / "runtimes") as f:
        [line] = [line for line in f if line.startswith(front.config + "\t")]
    key, runtime, ident, hooks, names = line.rstrip("\n").split("\t")
    assert (runtime, hooks) == (runc, "-")  # no hook to append


def _private(run, argv):
    """``argv`` in a mount namespace of its own whose /run is ``run``."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /run && exec "$@"',
            str(run), *argv]


def _private_front(tmp_path):
    """A recorded legacy front whose /run is tmp_path/run: (front, its /run/nvct there)."""
    _needs_root()
    runc = tmp_path / "fake-runc"
    runc.write_text("#!/bin/sh\nexit 0\n")
    runc.chmod(0o755)
    front = Front(tmp_path / "bin")
    front.config = legacy_config(tmp_path / "config.toml", str(runc))
    front.run = tmp_path / "run"
    front.run.mkdir()
    for _ in range(20):
        subprocess.run(_private(front.run, [front.shim, "state", "x"]), env=shim_env(front.config),
                       capture_output=True, timeout=60)
        with open(front.run / "nvct" / "runtimes") as f:
            line = [line.split("\t") for line in f if line.startswith(front.config + "\t")]
        if line and line[0][2][:1].isdigit() and line[0][3] != "-":
            return front, front.run / "nvct"
    raise AssertionError("never recorded")


def _private_create(front, tmp_path, name="bundle"):
    bundle = _bundle(tmp_path / name, _compact(_spec(None)))
    before = front.starts()["shim"]
    r = subprocess.run(_private(front.run, [front.shim, "create", "--bundle", bundle, "c1"]),
                       env=shim_env(front.config), capture_output=True, text=True, timeout=60)
    with open(os.path.join(bundle, "config.json")) as f:
        return r, json.load(f), front.starts()["shim"] - before


def test_a_symlinked_legacy_hooks_folder_is_not_followed(tmp_path):
    """Issue 22, finding 5: the front read the hook to append through a linked folder."""
    front, nvct_dir = _private_front(tmp_path)
    hooks = nvct_dir / "legacy-hooks"
    [name] = os.listdir(hooks)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    evil = {"path": "/bin/true", "args": ["evil"], "env": ["PATH=/bin"]}
    (elsewhere / name).write_text(f"{front.shim}\n{json.dumps(evil, separators=(',', ':'))[:-2]}\n")
    os.rename(hooks, tmp_path / "hooks-away")
    os.symlink(elsewhere, hooks)
    r, spec, starts = _private_create(front, tmp_path)
    assert starts == 1, r.stderr  # Python took it, and Python appends its own hook
    assert [h["path"] for h in spec["hooks"]["prestart"]] == [front.hook]


@pytest.mark.parametrize("how", ["cp -p", "rsync -t"])
def test_a_config_replaced_keeping_its_mtime_goes_to_python(tmp_path, how):
    """Issue 22, finding 5: the front appended the hook the old config named."""
    front, _ = _private_front(tmp_path)
    other_hook = tmp_path / "other-hook"
    shutil.copy(front.hook, other_hook)
    with open(front.config) as f:
        text = f.read()
    replacement = tmp_path / "replacement.toml"
    replacement.write_text(text + f'[nvidia-container-runtime-hook]\npath = "{other_hook}"\n')
    st = os.stat(front.config)
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    if how == "cp -p":
        subprocess.run(["cp", "-p", str(replacement), front.config], check=True)
    else:
        subprocess.run(["cp", "-p", str(replacement), front.config + ".tmp"], check=True)
        os.rename(front.config + ".tmp", front.config)
    assert os.stat(front.config).st_mtime_ns == st.st_mtime_ns
    r, spec, starts = _private_create(front, tmp_path)
    assert starts == 1, r.stderr
    assert [h["path"] for h in spec["hooks"]["prestart"]] == [str(other_hook)]


def test_a_killed_fronts_temporary_in_the_bundle_goes_with_the_next_create(front, tmp_path):
    """The front writes config.json beside it as .nvct-<its pid>.tmp; one a kill left (its pid gone)
    is removed by the next create of that bundle, which leaves nothing else beside config.json."""
    p = subprocess.Popen(["true"])
    p.wait()
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / f".nvct-{p.pid}.tmp").write_text('{"half')
    (bundle / f".nvct-{os.getpid()}.tmp").write_text("")  # a live writer's: kept
    got, starts = _create(front, tmp_path, _compact(_spec(None)), keep=[f".nvct-{os.getpid()}.tmp"])
    assert starts == 0 and got["hooks"]["prestart"] == [_hook(front)]
