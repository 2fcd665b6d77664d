"""An engine's own environment never breaks a GPU container, and no code it names runs in nvct.

``docker --gpus`` runs its hook with dockerd's whole environment, ``ctr --gpus`` with
the user's shell's, and every engine runs the shim with its own. Such an environment
may hold ``PYTHONDONTWRITEBYTECODE``, a ``PYTHONPATH``, an ``LD_LIBRARY_PATH`` of
relative or CUDA directories, a ``GCONV_PATH``... none of which is an attack, and all
of which the programs used to refuse (or, for glibc's, ignore). Here they name planted
code: Python modules and a library (constructor and gconv entry points, copied as
Python's own ``libz``/``libexpat``) that write a marker naming their process.

Each GPU container must start with its GPU and leave no marker; the shim hands the
runtime the engine's environment whole (an env-less hook of the spec sees it); a
refusal comes only where it protects something, and names whose environment it was.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import subprocess
import tempfile

import pytest

from tests.e2e.conftest import VENV_BIN, expected_nodes, node_config
from tests.security.test_hostile_env import EVIL_C, EVIL_PY, GPU_CHECK
from tests.support.bundle import make_bundle
from tests.support.containerd import CONTAINERD, CTR, Containerd
from tests.support.docker import DOCKER, DOCKERD, Dockerd
from tests.support.fixtures import BUSYBOX_IMAGE_QUALIFIED, busybox_image_tar, need_binaries, need_root  # noqa: F401 - fixtures
from tests.support.gpu_runs import PATH_ENV, SHIM, need_runtime
from tests.support.rootfs import make_rootfs
from tests.support.runtimes import RUNC, RUNTIMES, run_container

PROBE = "find /dev -type c -name 'nvidia*' | sort; dlopen-probe libcuda.so.1 && nvidia-smi -L"
PROGRAMS = ("nvidia-container-runtime-hook", "nvidia-cdi-hook", "nvidia-ctk", "nvct", "nvidia-container-cli",
            "nvidia-container-runtime")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(marker dir, an engine environment naming planted code in every variable nvct must not heed)."""
    need_binaries("/usr/bin/gcc")
    base = tmp_path_factory.mktemp("engine-env")
    mark = base / "markers"
    mark.mkdir()
    (base / "evil.c").write_text(EVIL_C)
    lib = base / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O", f'-DMARK="{mark}"', "-o", str(lib), str(base / "evil.c")],
                   check=True, capture_output=True)
    for copy in ("lib/libz.so.1", "lib/libexpat.so.1", "gconv/EVIL.so"):
        (base / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, base / copy)
    (base / "gconv/gconv-modules").write_text("module EVIL// INTERNAL EVIL 1\nmodule INTERNAL EVIL// EVIL 1\n")
    # A locale whose charset is EVIL: an interpreter starting under it converts through gconv/EVIL.so.
    with gzip.open("/usr/share/i18n/charmaps/ANSI_X3.4-1968.gz", "rt") as f:
        charmap = [line for line in f if not line.startswith("% alias")]
    (base / "EVIL.charmap").write_text("".join("<code_set_name> EVIL\n" if line.startswith("<code_set_name>")
                                               else line for line in charmap))
    (base / "locale").mkdir()
    subprocess.run(["localedef", "-f", str(base / "EVIL.charmap"), "-i", "POSIX", str(base / "locale/evil")],
                   capture_output=True, check=False)  # warns about categories POSIX lacks
    assert (base / "locale/evil/LC_CTYPE").exists()
    for path in ("pymods/sitecustomize.py", "pymods/nvct/__init__.py", "pymods/encodings/__init__.py"):
        (base / path).parent.mkdir(parents=True, exist_ok=True)
        (base / path).write_text(EVIL_PY % {"mark": mark, "how": "path"})
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{base}/pymods", "LD_LIBRARY_PATH": f"{base}/lib:lib",
           "GCONV_PATH": f"{base}/gconv", "LOCPATH": f"{base}/locale", "LC_ALL": "evil", "NLSPATH": f"{base}/gconv/%N",
           "TZDIR": f"{base}/gconv", "HOSTALIASES": f"{base}/gconv/gconv-modules"}
    return mark, env


def _markers(mark) -> dict:
    found = {p.name: p.read_text() for p in mark.iterdir()}
    for p in mark.iterdir():
        p.unlink()
    return found


def _debug_config(tmp_path, sim_node, mode: str, runtime: str = "runc") -> str:
    """The node's config, logging at debug level to ``tmp_path/nvct.log``."""
    config = node_config(tmp_path, sim_node, mode=mode, runtime=runtime)
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("[nvidia-container-runtime]\n", '[nvidia-container-runtime]\nlog-level = "debug"\n', 1))
    return config


def _assert_gpu_zero(result, sim_node) -> None:
    assert result.ok, result.describe()
    assert {line for line in result.stdout.splitlines() if line.startswith("/dev/")} == expected_nodes(sim_node, [0])
    assert "ok libcuda.so.1" in result.stdout


def _assert_dropped_logged(tmp_path) -> None:
    log = (tmp_path / "nvct.log").read_text()
    line = next(line for line in log.splitlines() if "environment: dropped" in line)
    for name in ("GCONV_PATH", "LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"):
        assert f" {name} " in line, line  # names only
    assert "/pymods" not in line


@pytest.mark.containers
def test_docker_gpus_with_a_hostile_engine_environment(busybox_image_tar, sim_node, tmp_path, planted):
    need_root("runs dockerd")
    need_binaries(DOCKERD, DOCKER, RUNC)
    mark, env = planted
    config = _debug_config(tmp_path, sim_node, "legacy")
    with Dockerd(extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, **env}, path_prefix=(VENV_BIN,)) as d:
        d.load(busybox_image_tar)
        result = d.run(["--rm", "--gpus", "device=0", BUSYBOX_IMAGE_QUALIFIED, "sh", "-c", PROBE])
    assert not _markers(mark)
    _assert_gpu_zero(result, sim_node)
    _assert_dropped_logged(tmp_path)


@pytest.mark.containers
def test_ctr_gpus_with_a_hostile_shell_environment(busybox_image_tar, sim_node, tmp_path, planted):
    """ctr's hook gets ctr's environment (here containerd's too): nvidia-container-cli configure."""
    need_root("runs containerd")
    need_binaries(CONTAINERD, CTR, RUNC)
    mark, env = planted
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(os.path.join(VENV_BIN, "nvidia-container-cli"), bindir / "nvidia-container-cli")
    config = node_config(tmp_path, sim_node, mode="legacy")
    with Containerd(path_prefix=[str(bindir)], extra_env={"NVIDIA_CTK_CONFIG_FILE_PATH": config, **env}) as daemon:
        daemon.import_image(busybox_image_tar)
        result = daemon.ctr_run(BUSYBOX_IMAGE_QUALIFIED, ["sh", "-c", PROBE], extra_args=["--gpus", "0"])
    assert not _markers(mark)
    _assert_gpu_zero(result, sim_node)


@pytest.mark.containers
@pytest.mark.parametrize("mode", ["legacy", "jit-cdi"])
@pytest.mark.parametrize("runtime", ["runc", "crun"])
def test_the_shim_under_a_hostile_engine_environment_hands_the_runtime_all_of_it(
        tmp_path, sim_node, planted, runtime, mode):
    need_runtime(runtime)
    mark, env = planted
    config = _debug_config(tmp_path, sim_node, mode, RUNTIMES[runtime][0])
    seen = tmp_path / "hook-env"
    probe = {"path": "/bin/sh", "args": ["sh", "-c", f"env > {seen}"]}  # no env: the runtime's own
    bundle = make_bundle(tmp_path / "bundle", make_rootfs(tmp_path), ["sh", "-c", GPU_CHECK],
                         [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0"], hooks={"prestart": [probe]})
    engine = {"NVIDIA_CTK_CONFIG_FILE_PATH": config, "PATH": "/usr/bin:/bin", "NOTIFY_PROBE": "a 'b'\nc", **env}
    result = run_container([SHIM], bundle, env=engine, timeout=60)
    assert not _markers(mark)
    assert result.rc == 0 and "gpu-ok" in result.stdout, result.describe()
    got = seen.read_text()
    for name, value in engine.items():
        assert f"{name}={value}\n" in got, name
    _assert_dropped_logged(tmp_path)


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_runs_in_a_cuda_users_shell(program, planted):
    """And with glibc's variables alone (the old check never looked at them: a locale of charset
    EVIL had the interpreter load gconv/EVIL.so), and with all of them."""
    mark, env = planted
    glibc = {name: env[name] for name in ("GCONV_PATH", "LOCPATH", "LC_ALL")}
    for extra in ({"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}, glibc, env):
        result = subprocess.run([os.path.join(VENV_BIN, program), "--version"], capture_output=True, text=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **extra}, timeout=60, check=False,
                                cwd="/")
        assert result.returncode == 0 and "version" in result.stdout.lower(), result.stderr
        assert not result.stderr
    assert not _markers(mark)


@pytest.mark.parametrize("value", ["evil.toml", "/proc/self/cwd/evil.toml", "/etc/../proc/1/root/x.toml"])
@pytest.mark.parametrize("argv", [["nvidia-container-runtime-hook", "prestart"],
                                  ["nvidia-container-cli", "configure", "/"]])
def test_a_path_of_nvcts_resolved_from_the_working_directory_is_refused(argv, value):
    """For a prestart hook that is the engine's bundle, or, for an env-less entry under runc, the
    container's rootfs: the hook must not read a config found there."""
    result = subprocess.run([os.path.join(VENV_BIN, argv[0]), *argv[1:]], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "NVIDIA_CTK_CONFIG_FILE_PATH": value},
                            input="{}", timeout=60, check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{argv[0]}: refusing to run: NVIDIA_CTK_CONFIG_FILE_PATH={value} in its environment" in result.stderr
    assert "the engine's" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.containers
def test_the_legacy_hook_run_with_a_containers_environment_refuses_nvcts_variables(tmp_path):
    """The legacy hook as a createContainer entry without env under runc: the image's config path
    (absolute, into its own rootfs) would steer it (its log file: a host write of the image's
    choosing). It runs in the rootfs, so the environment is the container's: one line, no write."""
    need_runtime("runc")
    rootfs = make_rootfs(tmp_path)
    host_file = tmp_path / "host-file"
    (tmp_path / "rootfs-config.toml").write_text(f'[nvidia-container-runtime]\ndebug = "{host_file}"\n')
    hook = {"path": os.path.join(VENV_BIN, "nvidia-container-runtime-hook"), "args": ["hook", "prestart"]}
    bundle = make_bundle(tmp_path / "bundle", rootfs, ["true"],
                         [PATH_ENV, "NVIDIA_VISIBLE_DEVICES=0",
                          f"NVIDIA_CTK_CONFIG_FILE_PATH={tmp_path}/rootfs-config.toml"],
                         hooks={"createContainer": [hook]})
    result = run_container([RUNC], bundle, timeout=60)
    assert result.rc != 0 and not host_file.exists(), result.describe()
    [line] = [line for line in result.stderr.splitlines() if "refusing to run" in line]
    assert "NVIDIA_CTK_CONFIG_FILE_PATH is set in its environment, which is the container's" in line



@contextlib.contextmanager
def _fake_dockerd(env: dict):
    """A process listening on a unix socket with ``env``: what doctor sees of a dockerd (pid, env)."""
    directory = tempfile.mkdtemp(prefix="nvct-env-")
    sock = os.path.join(directory, "docker.sock")
    script = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen(8)\n"
              "print('ready', flush=True)\nwhile True:\n    s.accept()[0].close()\n")
    proc = subprocess.Popen(["/usr/bin/python3", "-I", "-c", script, sock], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield sock
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _doctor(check, **options):
    from nvct.doctor import Options
    from nvct.doctor.model import Context

    [finding] = [f for f in check(Context(Options(**options))) if f.id.startswith("runtime.")]
    return finding


@pytest.mark.parametrize("extra, status", [({}, "ok"), ({"NVIDIA_CTK_CONFIG_FILE_PATH": "evil.toml"}, "fail")])
def test_doctor_runs_the_docker_gpus_hook_with_dockerds_environment(tmp_path, planted, extra, status):
    from nvct.doctor import runtimes

    # Neither the planted libraries nor the locale that loads gconv/EVIL.so: the stand-in for
    # dockerd is a Python, which would load them itself.
    env = {"PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", **planted[1],
           "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:lib", "LC_ALL": "C", **extra}
    with _fake_dockerd(env) as sock:
        gpus = _doctor(runtimes.check_docker_gpus, docker_socket=sock, docker_pidfile=str(tmp_path / "none"))
    assert gpus.status == status, gpus
    if status == "fail":
        assert ("but the hook fails in dockerd's environment (what docker run --gpus hands it): "
                "nvidia-container-runtime-hook: refusing to run: NVIDIA_CTK_CONFIG_FILE_PATH=evil.toml") in gpus.seen
        assert "restart dockerd" in gpus.fix
    assert not _markers(planted[0])


@pytest.mark.parametrize("extra, status", [({}, "ok"), ({"NVIDIA_CTK_CONFIG_FILE_PATH": "evil.toml"}, "fail")])
def test_doctor_runs_the_ctr_gpus_hook_with_the_shells_environment(tmp_path, planted, extra, status):
    from nvct.doctor import runtimes

    need_binaries(CTR)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("ctr", "nvidia-container-cli"):
        os.symlink(CTR if name == "ctr" else os.path.join(VENV_BIN, name), bindir / name)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", **planted[1], **extra}
    gpus = _doctor(runtimes.check_ctr_gpus, env=env)
    assert gpus.status == status, gpus
    if status == "fail":
        assert "nvidia-container-cli: refusing to run: NVIDIA_CTK_CONFIG_FILE_PATH=evil.toml" in gpus.seen
    assert not _markers(planted[0])
