"""The driver params mask never lands on a host file, in every path, through runc and crun.

Every GPU container gets the driver's ``/proc/driver/nvidia/params`` masked
(``ModifyDeviceFiles: 0``): by the chain hook the shim leaves (jit-cdi and cdi
mode, nvct.modifier.prepare), by the chain hook a CDI-aware engine runs from a
CDI spec (no shim), and by the legacy hook; one implementation, one rule. A volume at ``/proc/driver`` (or over
``/proc``) whose ``nvidia/params`` is a host file, or a link to one, must not
get that mount: with ``rootfsPropagation: shared`` on a host whose ``/`` is
shared (systemd), the mount would reach the host and stay after the container.

The host is stood in for by a private mount namespace with ``/`` made rshared.
After the container, that namespace must show no mount on the host files and
their content unchanged; the start is refused with one line naming the mount
(by the shim where it can tell from the spec and the image, else by the mask).
The rule (nvct.hooks.procmask.kernel_proc_path) is judged on every layout at the end,
through the hook program in both the shim's form and a CDI spec's. The
volumes run through the project's venv (a pip install) on every path, and a
symlinked ``nvidia/params`` through the jit-cdi runtime of a toolkit installed
with ``nvct toolkit install`` (its own nvct, Python and hook wrappers) and of
the project's .deb installed with dpkg in a private root.
"""

from __future__ import annotations

import os

import pytest

from tests.support.bundle import add_hook, edit_config, make_bundle
from tests.support.fixtures import rootfs  # noqa: F401 - fixtures
from tests.support.gpu_runs import NVCT, PATH_ENV, need_runtime, refusal, run_gpu
from tests.support.runtimes import RUNTIMES, run_container
from tests.support.toolkit_runs import installs, starter

pytestmark = pytest.mark.containers

SECRET = "ModifyDeviceFiles: 1\nthe host's own file\n"
#: How a volume leads the mask to a host file: its params is a link to one (absolute, or
#: relative within the volume), or is one.
KINDS = ("absolute", "relative", "file")
#: Where the volume lands: at /proc/driver, over /proc, at /data with the image's /data ->
#: /proc/driver, or at /data/x where x is a link to /proc/driver in an earlier volume at
#: /data (no look at the spec and the image can tell: the mask itself must refuse).
PLACES = ("driver", "proc", "redirect", "chain")
#: The shim's modes; the chain run by an engine from a CDI spec (no shim); the shim's
#: mask hook alone (no shim in front to refuse the volume).
PATHS = ("jit-cdi", "cdi", "legacy", "cdi-hook", "mask-hook")
#: Places the shim's look at the spec and the image sees.
SEEN = ("driver", "proc", "redirect")


def _host(tmp_path, kind: str, place: str) -> tuple[str, str]:
    """(the host tree, the volume's source), under tmp_path/host."""
    host = tmp_path / "host"
    host.mkdir()
    secret = host / "secret"
    secret.write_text(SECRET)
    volume = host / "volume"
    nvidia = volume / ("driver/nvidia" if place == "proc" else "nvidia")
    nvidia.mkdir(parents=True)
    if kind == "absolute":
        os.symlink(str(secret), nvidia / "params")
    elif kind == "relative":
        (volume / "secret").write_text(SECRET)
        os.symlink("../secret" if place != "proc" else "../../secret", nvidia / "params")
    else:
        (nvidia / "params").write_text(SECRET)
    if place == "chain":
        (host / "earlier").mkdir()
        os.symlink("/proc/driver", host / "earlier/x")
    return str(host), str(volume)


def _volumes(place: str, host: str, source: str) -> list[dict]:
    options = ["rbind", "rshared"]
    if place == "chain":
        return [{"destination": "/data", "type": "bind", "source": os.path.join(host, "earlier"), "options": options},
                {"destination": "/data/x", "type": "bind", "source": source, "options": options}]
    where = {"driver": "/proc/driver", "proc": "/proc", "redirect": "/data"}[place]
    return [{"destination": where, "type": "bind", "source": source, "options": options}]


def _systemd_host(host: str, report: str) -> list[str]:
    """A private mount namespace with / rshared, ``host`` a mount of its own (a data disk: crun makes
    the root's parent mount private); after the run, what that namespace shows of ``host``."""
    script = ('mount --bind "$HOST" "$HOST" && mount --make-rshared / || exit 99\n'
              '"$@"; rc=$?\n'
              '[ -e "$REPORT" ] && exit $rc\n'  # the runtime's delete afterwards
              'awk -v top="$HOST" \'index($5, top) == 1 && $5 != top { print "mounted:", $5 }\' '
              '/proc/self/mountinfo > "$REPORT"\n'
              'for f in $(find "$HOST" -type f); do echo "content: $f: $(tr "\\n" "|" < "$f")"; done >> "$REPORT"\n'
              'exit $rc\n')
    return ["/usr/bin/env", f"HOST={host}", f"REPORT={report}", "/usr/bin/unshare", "-m", "--propagation", "private",
            "/bin/sh", "-c", script, "systemd-host"]


def _assert_host_untouched(report: str) -> None:
    with open(report) as f:
        lines = f.read().splitlines()
    assert not [line for line in lines if line.startswith("mounted:")], lines
    contents = [line for line in lines if line.startswith("content:")]
    assert contents and all(line.endswith(": " + SECRET.replace("\n", "|")) for line in contents), lines


def _run(tmp_path, sim_node, rootfs, path: str, runtime: str, volumes: list[dict], wrapper: list[str], start=run_gpu):
    def edit(spec: dict) -> None:
        spec["linux"]["rootfsPropagation"] = "shared"
        if volumes[0]["destination"] == "/proc":
            spec["mounts"] = [m for m in spec["mounts"] if m["destination"] != "/proc"]
        spec["mounts"] += volumes

    command = "cat /proc/driver/nvidia/params"
    if path in ("jit-cdi", "cdi", "legacy"):
        return start(tmp_path, sim_node, rootfs, mode=path, runtime=runtime, env=["NVIDIA_VISIBLE_DEVICES=0"],
                     command=command, edit=edit, wrapper=wrapper)
    bundle = make_bundle(str(tmp_path / "bundle"), rootfs, ["sh", "-c", command], env=[PATH_ENV])
    with edit_config(bundle) as spec:
        edit(spec)
    if path == "cdi-hook":  # a CDI-aware engine runs the spec's hook itself
        add_hook(bundle, "createContainer", NVCT, ["nvct", "hook", "chain", "disable-device-node-modification"],
                 env=[PATH_ENV])
    else:  # the shim's hook, as Plan.edit writes it
        add_hook(bundle, "createContainer", NVCT, _MASK_HOOK + ["--container-root", rootfs,
                                                                "disable-device-node-modification"], env=[PATH_ENV])
    return run_container([*wrapper, *RUNTIMES[runtime]], bundle)


def _cases():
    """What the volume holds matters to whoever masks; to the shim's refusal only where it is.
    runc refuses every volume under /proc itself (its /proc rule): one kind there."""
    for path in PATHS:
        for place in PLACES:
            for runtime in ("runc", "crun"):
                for kind in KINDS if runtime == "crun" and path not in ("jit-cdi", "cdi") else ("file",):
                    yield pytest.param("venv", kind, place, path, runtime, id=f"{kind}-{place}-{path}-{runtime}")
    # Through a toolkit and the .deb: the shim's refusal, and (crun: runc refuses that mount itself) the
    # install's mask hook's.
    for install in ("toolkit", "deb"):
        for place, runtime in (("driver", "runc"), ("driver", "crun"), ("chain", "crun")):
            yield pytest.param(install, "absolute", place, "jit-cdi", runtime,
                               id=f"{install}-absolute-{place}-jit-cdi-{runtime}")


@pytest.mark.parametrize("install, kind, place, path, runtime", _cases())
def test_a_proc_volume_never_gets_the_mask_on_a_host_file(request, tmp_path, sim_node, rootfs, install, kind, place,
                                                          path, runtime):
    """The host tree is untouched and the start refused, whoever masks (runc refuses most volumes itself)."""
    need_runtime(runtime)
    start = starter(install, installs(request, install))
    host, source = _host(tmp_path, kind, place)
    if place == "redirect":
        os.symlink("/proc/driver", os.path.join(rootfs, "data"))
    report = str(tmp_path / "report")
    result = _run(tmp_path, sim_node, rootfs, path, runtime, _volumes(place, host, source), _systemd_host(host, report),
                  start)
    _assert_host_untouched(report)
    text = refusal(result, tmp_path)
    named = "/data" if place == "redirect" else _volumes(place, host, source)[0]["destination"]
    if place in SEEN and (path in ("jit-cdi", "cdi") or (path == "legacy" and runtime == "crun")):
        # the shim before the runtime runs, or the legacy hook (runc refuses these mounts itself)
        assert f"mount at {named}: a GPU container may not mount anything at or under /proc" in text, text
    elif path == "legacy" and runtime == "crun":  # what only the mask itself can see
        assert "not on the kernel's procfs (a volume?); refusing to mask it" in text, text
    elif path in ("jit-cdi", "cdi") and runtime == "crun":  # the chain's mask step in nvct's hook (crun hides why)
        assert "nvct` (exit code: 1)" in text, text


# -- the rule itself: the step and the hook program, in both forms, judge every layout alike ----

#: The hook program's chain, as the shim writes it.
_MASK_HOOK = ["nvct", "hook", "chain"]

#: layout -> (what the hook program and the step say): "masked", "nothing" (no params there),
#: or the words of the refusal.
RULE = {
    "own": "masked",  # this process's own /proc file (a simulated node's /proc/driver)
    "missing": "nothing",
    "plain": "not on the kernel's procfs",
    "link-params": "symlink",
    "link-nvidia": "symlink",
    "link-driver": "symlink",
    "link-proc": "symlink",
}


def _layout(tmp_path, layout: str) -> str:
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere/driver/nvidia"
    elsewhere.mkdir(parents=True)
    (elsewhere / "params").write_text(SECRET)
    if layout == "link-proc":
        root.mkdir()
        os.symlink(str(tmp_path / "elsewhere"), root / "proc")
        return str(root)
    (root / "proc").mkdir(parents=True)
    if layout == "missing":
        return str(root)
    if layout == "link-driver":
        os.symlink(str(tmp_path / "elsewhere/driver"), root / "proc/driver")
        return str(root)
    (root / "proc/driver").mkdir()
    if layout == "link-nvidia":
        os.symlink("../../../elsewhere/driver/nvidia", root / "proc/driver/nvidia")
        return str(root)
    (root / "proc/driver/nvidia").mkdir()
    if layout == "link-params":
        os.symlink(str(elsewhere / "params"), root / "proc/driver/nvidia/params")
    else:
        (root / "proc/driver/nvidia/params").write_text(SECRET)
    return str(root)


def _judge(root: str, layout: str, masked: str, form: list[str]) -> tuple[str, str, str]:
    """In a private mount namespace: (the hook program's verdict, the step's, what params shows after the hook)."""
    import subprocess

    from nvct.base.errors import ContainerError
    from nvct.hooks.procmask import PARAMS, kernel_proc_path
    from nvct.rootfs.root import Rootfs

    if layout == "own":
        subprocess.run(["mount", "--bind", os.path.join(root, "proc/driver"), "/proc/driver"], check=True)
    with Rootfs(root) as opened:
        try:
            python = "masked" if kernel_proc_path(opened, PARAMS) else "nothing"
        except ContainerError as e:
            python = str(e)
    argv, state = _form(form, root)
    run = subprocess.run(argv, input=state, capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    sh = {0: "masked" if layout == "own" else "nothing"}.get(run.returncode, run.stderr)
    shown = ""
    if os.path.lexists(os.path.join(root, "proc/driver/nvidia/params")):
        with open(os.path.join(root, "proc/driver/nvidia/params")) as f:
            shown = f.read()
    return sh, python, shown


#: The hook program's two forms: the shim's (the root named) and a CDI spec's (the state on stdin).
FORMS = {"shim": "container-root", "cdi-spec": "state"}


def _form(form, root: str) -> tuple[list[str], str]:
    """(argv, stdin) of the mask hook in ``form``, for ``root`` (a bundle beside it for the state's)."""
    import json

    if form == "container-root":
        return [NVCT, "hook", "chain", "--container-root", root, "disable-device-node-modification"], "{}"
    bundle = os.path.join(os.path.dirname(root), "bundle")
    os.makedirs(bundle, exist_ok=True)
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump({"ociVersion": "1.0.2", "root": {"path": root}, "mounts": []}, f)
    state = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": os.getpid(), "bundle": bundle}
    return [NVCT, "hook", "chain", "disable-device-node-modification"], json.dumps(state)


@pytest.mark.parametrize("shell", sorted(FORMS))
@pytest.mark.parametrize("layout", sorted(RULE))
def test_the_sh_hook_and_the_python_step_are_one_rule(tmp_path, layout, shell):
    from nvct.linux.namespaces import in_private_mount_namespace
    from tests.support.fixtures import need_root

    need_root()
    root = _layout(tmp_path, layout)
    masked = tmp_path / "masked"
    masked.write_text("ModifyDeviceFiles: 0\n")
    sh, python, shown = in_private_mount_namespace(_judge, root, layout, str(masked), FORMS[shell])
    want = RULE[layout]
    assert want in sh and want in python, (sh, python)
    assert sh.count("\n") <= 1 and "\n" not in python  # one line each
    masked_secret = SECRET.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0")  # the other lines kept
    assert shown == (masked_secret if want == "masked" else SECRET if layout != "missing" else "")
    assert (tmp_path / "elsewhere/driver/nvidia/params").read_text() == SECRET


@pytest.mark.parametrize("shell", sorted(FORMS))
def test_the_sh_hook_refuses_a_root_named_through_a_symlink(tmp_path, shell):
    """The root's own path is checked too (nvct.rootfs.root.open_root): a swapped root.path leads elsewhere."""
    import subprocess

    root = _layout(tmp_path, "plain")
    os.symlink(root, tmp_path / "alias")
    argv, state = _form(FORMS[shell], str(tmp_path / "alias"))
    run = subprocess.run(argv, input=state, capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and "through a symlink" in run.stderr, run
