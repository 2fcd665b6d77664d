"""The .rpm: built with rpmbuild from a tarball of the tree, then inspected."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvct.programs.version import REFERENCE_VERSION
from tests.packaging.pkgtest import BUILD_ENV, REPO, build_package, no_driver_config, project_version, tree_modules
from tests.support.proc import SYSTEM_PATH, run

PROGRAMS = ("nvct", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli",
            "nvidia-cdi-hook", "nvidia-ctk", "nvidia-ctk-installer", "nvidia-toolkit")
UNITS = ("/usr/lib/systemd/system/nvidia-cdi-refresh.service", "/usr/lib/systemd/system/nvidia-cdi-refresh.path")
MODE_RUNTIMES = ("/usr/bin/nvidia-container-runtime.cdi", "/usr/bin/nvidia-container-runtime.legacy")
CONFFILE = "/etc/nvidia-container-runtime/config.toml"
OCI_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
NORMALIZE = "/usr/libexec/nvct/normalize-config"
SITE = re.compile(r"^/usr/lib/python3\.\d+/site-packages/")
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools")


def _missing_tools() -> str:
    missing = [t for t in ("rpmbuild", "rpm2archive") if shutil.which(t, path=SYSTEM_PATH) is None]
    if run(["/usr/bin/python3", "-c", "import build, installer, setuptools, wheel"],
           env=BUILD_ENV, cwd="/").rc != 0:
        missing.append("python3-build, python3-installer, python3-setuptools, python3-wheel")
    return ", ".join(missing)


_MISSING = _missing_tools()
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs the .rpm build tools: {_MISSING}")


@pytest.fixture(scope="module")
def rpm(tmp_path_factory) -> SimpleNamespace:
    modules = tree_modules()  # before the build copies the tree
    path = build_package("build-rpm.sh", tmp_path_factory.mktemp("rpm"))
    path = Path(os.environ.get("NVCT_TEST_RPM") or path)  # another build's (an older commit's, to see a test fail)

    def query(*args: str) -> str:
        return run(["rpm", "-qp", *args, str(path)], env=BUILD_ENV).check().stdout

    return SimpleNamespace(path=path, modules=modules, query=query, files=query("-l").split(),
                           payload=_payload(path))


def _payload(path: Path) -> dict[str, bytes]:
    """Every regular file in the package: path -> content."""
    with open(path, "rb") as f:
        data = subprocess.run(["rpm2archive", "-"], stdin=f, capture_output=True,
                              env=BUILD_ENV, check=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name[1:]: tar.extractfile(m).read() for m in tar if m.isfile()}


def test_rpm_is_named_and_versioned_for_the_project(rpm):
    version = project_version()
    assert rpm.path.name == f"nvct-{version}-1.noarch.rpm"
    assert rpm.query("--qf", "%{NAME} %{VERSION} %{ARCH}") == f"nvct {version} noarch"


def test_rpm_installs_the_programs_config_hook_and_python_package(rpm):
    wanted = {f"/usr/bin/{p}" for p in PROGRAMS} | set(UNITS) | set(MODE_RUNTIMES) | {CONFFILE, OCI_HOOK, NORMALIZE}
    assert wanted <= set(rpm.files), sorted(wanted - set(rpm.files))
    modules = {SITE.sub("", f) for f in rpm.files if SITE.match(f)}
    assert {"nvct/__init__.py", "nvct/programs/shim.py", "nvct/programs/hook.py", "nvct/cli/__init__.py",
            f"nvct-{project_version()}.dist-info/METADATA"} <= modules
    assert {m for m in modules if m.startswith("nvct/") and m.endswith(".py")} == rpm.modules
    modes = dict(line.rsplit(" ", 1) for line in
                 rpm.query("--qf", "[%{FILENAMES} %{FILEMODES:octal}\n]").splitlines())
    for program in [f"/usr/bin/{p}" for p in PROGRAMS] + [NORMALIZE]:
        assert modes[program].endswith("755"), f"{program}: mode {modes[program]}"


def test_rpm_entries_are_root_owned_and_writable_by_root_alone(rpm):
    # built under umask 000 (pkgtest.build_package)
    entries = rpm.query("--qf", "[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]").splitlines()
    loose = [e for e in entries if e.split()[1] != "root:root" or (not e.startswith("l") and "w" in e[4] + e[7])]
    assert entries and loose == []


def test_rpm_programs_run_the_system_python3(rpm):
    for program in PROGRAMS:
        text = rpm.payload[f"/usr/bin/{program}"].decode()
        first = text.splitlines()[0]
        # sh fronts that start the system python3 with -I (a line no packager's shebang rewrite drops)
        assert first == "#!/bin/sh" and "python=/usr/bin/python3" in text, f"/usr/bin/{program}"
        assert '"$python" -I' in text, f"/usr/bin/{program}"


def test_rpm_config_is_noreplace_with_the_shipped_content(rpm):
    assert rpm.query("-c").split() == [CONFFILE]
    flags = dict(line.rsplit(" ", 1) for line in
                 rpm.query("--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]").splitlines())
    assert set(flags[CONFFILE]) >= {"c", "n"}  # %config(noreplace)
    assert rpm.payload[CONFFILE] == (REPO / "config/config.toml").read_bytes()
    assert rpm.payload[OCI_HOOK] == (REPO / "hooks/oci-nvidia-hook.json").read_bytes()
    assert rpm.payload[NORMALIZE] == (REPO / "packaging/normalize-config").read_bytes()
    assert NORMALIZE in rpm.query("--scripts")


def test_rpm_requires_the_python_modules(rpm):
    requires = {line.strip() for line in rpm.query("-R").splitlines()}
    assert {"python3-click", "python3-tomlkit", "python3-prctl",
            "python3-pyyaml", "python3 >= 3.9"} <= requires, sorted(requires)
    assert not [r for r in requires if "elftools" in r], sorted(requires)  # the tests' ELF reader, not nvct's


def test_rpm_takes_the_place_of_the_nvidia_container_toolkit(rpm):
    assert set(rpm.query("--conflicts").split()) == set(TOOLKIT_PACKAGES)
    provides = {line.strip() for line in rpm.query("--provides").splitlines()}
    assert {f"{name} = {REFERENCE_VERSION}" for name in TOOLKIT_PACKAGES} <= provides, sorted(provides)
    assert not any(p.startswith("libnvidia-container1") for p in provides)
    assert rpm.query("--obsoletes").strip() == ""  # never replaced on a plain upgrade


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (rpm sets file owners)")
def test_rpm_keeps_a_config_it_does_not_own_and_an_edited_one_on_erase(rpm, tmp_path):
    # Into a private root, scripts and dependencies left out: rpm's own file handling.
    root = tmp_path / "root"
    conf = root / CONFFILE[1:]
    conf.parent.mkdir(parents=True)
    conf.write_text("left by the NVIDIA Container Toolkit\n")
    rpm_cmd = ["rpm", "--root", str(root), "--nodeps", "--noscripts"]
    run([*rpm_cmd[:3], "--initdb"], env=BUILD_ENV).check()
    run([*rpm_cmd, "-i", str(rpm.path)], env=BUILD_ENV, timeout=60).check()
    assert conf.read_text() == "left by the NVIDIA Container Toolkit\n"
    assert (root / (CONFFILE[1:] + ".rpmnew")).read_bytes() == rpm.payload[CONFFILE]
    for program in PROGRAMS:
        assert (root / "usr/bin" / program).is_file()
    run([*rpm_cmd, "-e", "nvct"], env=BUILD_ENV, timeout=60).check()
    assert not (root / "usr/bin/nvct").exists()
    assert (root / (CONFFILE[1:] + ".rpmsave")).read_text() == "left by the NVIDIA Container Toolkit\n"


def test_rpm_enables_the_cdi_refresh_units(rpm):
    for unit in UNITS:
        assert "WantedBy=multi-user.target" in rpm.payload[unit].decode()
    scripts = rpm.query("--scripts")
    assert "enable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service" in scripts


# --------------------------------------------------------------------------- scripts that cannot half-fail


#: Runs in a private mount namespace: a root $R that is this machine's /usr, /etc and /var under
#: overlays (so rpm writes only into $W), its own /run and /tmp, the host's /proc, /dev and /sys,
#: and $W at its own path (the simulated node, the bundles). rpm runs its scriptlets chrooted
#: into $R, where Debian's python3 is told about rpm's site-packages by a .pth file.
_PRIVATE_ROOT = r"""
set -eu
R=$W/root
mkdir -p "$R" && mount --bind "$R" "$R"  # a mount point, as runc wants the root it prepares to be
for d in usr etc var; do
    mkdir -p "$W/up/$d" "$W/work/$d" "$R/$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$W/up/$d,workdir=$W/work/$d" "$R/$d"
done
for l in bin sbin lib lib32 lib64 libx32; do [ -L "/$l" ] && ln -sfn "$(readlink "/$l")" "$R/$l"; done
mkdir -p "$R/proc" "$R/dev" "$R/sys" "$R/run" "$R/tmp"
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount --rbind /sys "$R/sys"
mount -t tmpfs tmpfs "$R/run"
mount -t tmpfs tmpfs "$R/tmp"
mkdir -p "$R$W"
mount --bind "$W" "$R$W"
site=$(chroot "$R" /usr/bin/python3 -c \
    'import sysconfig; print(sysconfig.get_path("purelib", "posix_prefix", vars={"base": "/usr"}))')
echo "$site" > "$R/usr/lib/python3/dist-packages/zz-nvct-rpm-test.pth"
rpm --root "$R" --initdb
step() {  # step NAME CMD...: run it, record its status and output
    name=$1; shift
    echo "$name" > "$W/phase"
    set +e
    "$@" > "$W/step-$name.out" 2>&1
    echo "$name $?" >> "$W/steps"
    set -e
}
"""

#: GPU containers back to back through the installed runtime, chrooted into $R, until $W/stop.
_STARTS = r"""
starts() {
    n=0
    while [ ! -e "$W/stop" ]; do
        n=$((n + 1)); at=$(cat "$W/phase")
        rm -rf "$W/b"; cp -a "$W/pristine" "$W/b"
        out=$(NVIDIA_CTK_CONFIG_FILE_PATH=$NODE_CONFIG PATH=/usr/sbin:/usr/bin:/sbin:/bin \
              chroot "$R" /usr/bin/nvidia-container-runtime --root /run/nvct-rpm-test \
                  run --no-pivot --bundle "$W/b" "c$n" \
              </dev/null 2>&1) && rc=0 || rc=$?
        gpu=$(printf '%s\n' "$out" | grep -c '^has-nvidia0$' || :)
        echo "$at $(cat "$W/phase") $rc $gpu" >> "$W/starts"
        [ "$rc" = 0 ] || printf '%s\n' "$out" | tail -n 3 > "$W/last-failure-$at"
    done
}
"""


def _in_private_root(tmp_path: Path, body: str, env: dict | None = None, timeout: float = 300):
    script = tmp_path / "scenario.sh"
    script.write_text(_PRIVATE_ROOT + body)
    return run(["unshare", "-m", "--propagation", "private", "bash", str(script)],
               env={**BUILD_ENV, "W": str(tmp_path), **(env or {})}, timeout=timeout)


def _steps(tmp_path: Path) -> dict[str, int]:
    lines = (tmp_path / "steps").read_text().splitlines() if (tmp_path / "steps").exists() else []
    return {name: int(rc) for name, rc in (line.split() for line in lines)}


def _step_output(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"step-{name}.out").read_text()


needs_private_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare", path=SYSTEM_PATH) is None,
    reason="needs root and unshare (a private root with overlay mounts)")


@needs_private_root
def test_rpm_erase_goes_on_when_the_cache_cannot_be_removed(rpm, tmp_path):
    """%postun's ``rm -rf /run/nvct`` was its last command: a start writing the cache failed the erase."""
    result = _in_private_root(tmp_path, f"""
step install rpm --root "$R" --nodeps -i {rpm.path}
mkdir -p "$R/run/nvct/busy" && mount -t tmpfs nvct-busy "$R/run/nvct/busy"  # rm -rf fails on it every time
step erase rpm --root "$R" --nodeps -e nvct
rpm --root "$R" -q nvct > "$W/after" 2>&1 || :
""")
    assert result.ok, result.describe()
    steps = _steps(tmp_path)
    assert steps == {"install": 0, "erase": 0}, (steps, _step_output(tmp_path, "erase"))
    erase = _step_output(tmp_path, "erase")
    assert "nvct: could not remove /run/nvct (in use); remove it by hand: rm -rf /run/nvct" in erase, erase
    assert "scriptlet failed" not in erase, erase  # rpm 4.18 warns; older ones fail the erase
    assert (tmp_path / "after").read_text().strip() == "package nvct is not installed"


@pytest.fixture(scope="module")
def upgraded_rpm(tmp_path_factory) -> Path:
    """The same version, a later release (``-1.upgrade1``): what ``rpm -U`` upgrades to."""
    path = build_package("build-rpm.sh", tmp_path_factory.mktemp("rpm-upgrade"), env={"RPM_DIST": ".upgrade1"})
    return Path(os.environ.get("NVCT_TEST_RPM_UPGRADE") or path)


@needs_private_root
@pytest.mark.skipif(not os.access("/usr/sbin/runc", os.X_OK), reason="needs /usr/sbin/runc")
def test_rpm_container_starts_during_install_upgrade_reinstall_and_erase(rpm, upgraded_rpm, tmp_path):
    """GPU containers start back to back while rpm installs, upgrades, reinstalls and erases nvct:
    every rpm step succeeds, and while the programs are there every start gets its GPU."""
    from nvct.simulate.node import build_node
    from tests.packaging.test_deb import GPU_CHECK
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    node_config = build_node(tmp_path / "node")["config"]
    make_bundle(tmp_path / "pristine", make_rootfs(tmp_path / "pristine"), ["/bin/sh", "-c", GPU_CHECK],
                ["NVIDIA_VISIBLE_DEVICES=0"])
    result = _in_private_root(tmp_path, _STARTS + f"""
echo before > "$W/phase"
starts &
enter() {{  # enter phase $1 and wait for a start that began and ended in it
    echo "$1" > "$W/phase"
    until grep -q "^$1 $1 " "$W/starts" 2>/dev/null; do sleep 0.05; done
}}
enter before
step install rpm --root "$R" --nodeps -i {rpm.path}
enter after-install
step upgrade rpm --root "$R" --nodeps -U {upgraded_rpm}
enter after-upgrade
step reinstall rpm --root "$R" --nodeps -U --replacepkgs {upgraded_rpm}
enter after-reinstall
step erase rpm --root "$R" --nodeps -e nvct
enter after-erase
touch "$W/stop"; wait
rpm --root "$R" -q nvct > "$W/after" 2>&1 || :
ls -A "$R/run/nvct" "$R/var/lib/nvct" "$R/usr/bin/nvct" "$R$site/nvct" > "$W/left" 2>&1 || :
""", env={"NODE_CONFIG": node_config})
    assert result.ok, result.describe()
    steps = _steps(tmp_path)
    assert steps == {"install": 0, "upgrade": 0, "reinstall": 0, "erase": 0}, \
        {name: _step_output(tmp_path, name) for name, rc in steps.items() if rc}
    for name in steps:
        assert "scriptlet failed" not in _step_output(tmp_path, name), _step_output(tmp_path, name)
    starts = [line.split() for line in (tmp_path / "starts").read_text().splitlines()]
    inside = [s for s in starts if s[0] == s[1] and s[0] in ("after-install", "upgrade", "after-upgrade",
                                                             "reinstall", "after-reinstall")]
    failures = {p.name: p.read_text() for p in tmp_path.glob("last-failure-*")}
    assert inside and all(s[2] == "0" and s[3] == "1" for s in inside), (inside, failures)
    assert (tmp_path / "after").read_text().strip() == "package nvct is not installed"
    left = (tmp_path / "left").read_text()
    assert left.count("No such file or directory") == 4, left


# --------------------------------------------------------------------------- the CDI spec without systemd


SPEC = "/var/run/cdi/nvidia.yaml"  # where nvidia-cdi-refresh.service writes it
ENV_FILE = "/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env"
#: A spec of another vendor's: no hook runs nvct's programs, so the erase leaves it alone.
FOREIGN_SPEC = 'cdiVersion: "0.5.0"\nkind: example.com/dev\ndevices:\n- name: null\n  containerEdits:\n' \
               '    deviceNodes:\n    - path: /dev/null\n'

#: The refresh unit's env file in the private root ($R/etc is an overlay), naming the node's config:
#: what it sets reaches `nvidia-ctk cdi generate`, as under the unit.
_ENV_FILE = f"""
mkdir -p "$R{os.path.dirname(ENV_FILE)}"
printf '# the node\\n NVIDIA_CTK_CONFIG_FILE_PATH = "%s"\\n' "$NODE_CONFIG" > "$R{ENV_FILE}"
"""


@needs_private_root
@pytest.mark.skipif(not (os.access("/usr/sbin/runc", os.X_OK) and os.access("/usr/bin/crun", os.X_OK)),
                    reason="needs /usr/sbin/runc and /usr/bin/crun")
def test_rpm_install_without_systemd_writes_the_cdi_spec_containers_get_their_gpu_from(rpm, tmp_path):
    """The private root's /run is a fresh tmpfs (no systemd): %post writes the refresh unit's spec, with
    its env file; CDI requests through runc and crun get GPU 0 from it; the erase removes it, and leaves
    another vendor's spec alone."""
    import json

    import yaml

    from nvct.simulate.node import build_node
    from tests.packaging.test_deb import GPU_CHECK
    from tests.support.bundle import make_bundle
    from tests.support.rootfs import make_rootfs

    node_config = build_node(tmp_path / "node")["config"]
    for runtime in ("runc", "crun"):  # the shim in cdi mode reads the spec dirs engines read
        Path(tmp_path / f"cdi-{runtime}.toml").write_text(
            Path(node_config).read_text() + f'\n[nvidia-container-runtime]\nmode = "cdi"\nruntimes = ["{runtime}"]\n')
        make_bundle(tmp_path / f"b-{runtime}", make_rootfs(tmp_path / f"b-{runtime}"), ["/bin/sh", "-c", GPU_CHECK],
                    ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"])
    result = _in_private_root(tmp_path, _ENV_FILE + f"""
step install rpm --root "$R" --nodeps -i {rpm.path}
ls -A "$R/run/cdi" > "$W/cdi-after-install" 2>&1 || :
cp "$R/run/cdi/nvidia.yaml" "$W/spec.yaml" || :  # $R/var/run links to /run: $R's once chrooted
for rt in runc crun; do
    step "$rt" env NVIDIA_CTK_CONFIG_FILE_PATH="$W/cdi-$rt.toml" PATH=/usr/sbin:/usr/bin:/sbin:/bin \\
        chroot "$R" /usr/bin/nvidia-container-runtime --root /run/nvct-rpm-test run --no-pivot \\
            --bundle "$W/b-$rt" "c-$rt" </dev/null
done
mkdir -p "$R/run/cdi" && printf '%s' '{FOREIGN_SPEC}' > "$R/run/cdi/vendor.yaml"
step erase rpm --root "$R" --nodeps -e nvct
ls -A "$R/run/cdi" > "$W/cdi-after-erase" 2>&1 || :
cp "$R/run/cdi/vendor.yaml" "$W/vendor-after-erase.yaml" || :
""", env={"NODE_CONFIG": node_config})
    assert result.ok, result.describe()
    steps = _steps(tmp_path)
    assert steps == {"install": 0, "runc": 0, "crun": 0, "erase": 0}, \
        {name: _step_output(tmp_path, name) for name, rc in steps.items() if rc}
    assert f"nvct: wrote {SPEC} (cdiVersion " in _step_output(tmp_path, "install"), _step_output(tmp_path, "install")
    assert (tmp_path / "cdi-after-install").read_text().split() == ["nvidia.yaml"]  # no temporary file left
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and {"0", "all"} <= {d["name"] for d in spec["devices"]}
    spec_hooks = {h["path"] for h in spec["containerEdits"]["hooks"]}
    assert spec_hooks and spec_hooks <= {f"/usr/bin/{p}" for p in PROGRAMS}, spec_hooks
    for runtime in ("runc", "crun"):
        said = _step_output(tmp_path, runtime).splitlines()
        assert "has-nvidia0" in said and any(line.startswith("ok libcuda.so.1 /") for line in said), (runtime, said)
        config = json.loads((tmp_path / f"b-{runtime}" / "config.json").read_text())
        hooks = {h["path"] for stage in config.get("hooks", {}).values() for h in stage}
        assert spec_hooks <= hooks, (runtime, hooks)  # the generated spec's edits, not another path
    erase = _step_output(tmp_path, "erase")
    assert f"nvct: removed {SPEC} (a CDI spec whose hooks run nvct's programs)" in erase, erase
    assert (tmp_path / "cdi-after-erase").read_text().split() == ["vendor.yaml"]
    assert (tmp_path / "vendor-after-erase.yaml").read_text() == FOREIGN_SPEC


@needs_private_root
def test_rpm_install_without_driver_succeeds_with_one_line_and_no_spec_and_leaves_systemd_to_the_units(
        rpm, tmp_path):
    """No driver: %post says so in one line, writes nothing, and the install succeeds. Where systemd runs
    (/run/systemd/system), the enabled units write the spec: %post neither generates nor says anything."""
    no_driver = no_driver_config(tmp_path)  # a node whose kernel has no NVIDIA module loaded
    result = _in_private_root(tmp_path, _ENV_FILE + f"""
step install rpm --root "$R" --nodeps -i {rpm.path}
ls -A "$R/run/cdi" > "$W/cdi-after-install" 2>&1 || :
step upgrade rpm --root "$R" --nodeps -U --replacepkgs {rpm.path}
ls -A "$R/run/cdi" > "$W/cdi-after-upgrade" 2>&1 || :
step erase rpm --root "$R" --nodeps -e nvct
mkdir -p "$R/run/systemd/system"
step systemd rpm --root "$R" --nodeps -i {rpm.path}
ls -A "$R/run/cdi" > "$W/cdi-under-systemd" 2>&1 || :
step erase-systemd rpm --root "$R" --nodeps -e nvct
""", env={"NODE_CONFIG": str(no_driver)})
    assert result.ok, result.describe()
    steps = _steps(tmp_path)
    assert steps == {"install": 0, "upgrade": 0, "erase": 0, "systemd": 0, "erase-systemd": 0}, \
        {name: _step_output(tmp_path, name) for name, rc in steps.items() if rc}
    for step in ("install", "upgrade"):
        out = _step_output(tmp_path, step)
        said = [line for line in out.splitlines() if "CDI spec" in line or "cdi generate" in line]
        assert len(said) == 1 and "scriptlet failed" not in out, (step, out)
        assert said[0] == (f"nvct: no CDI spec written to {SPEC} (no systemd here to run nvidia-cdi-refresh): "
                           f"{tmp_path}/no-driver/proc/driver/nvidia/version: not found: the NVIDIA driver is not "
                           "loaded "
                           "(load its kernel module: modprobe nvidia); once the driver is loaded, run: "
                           f"nvidia-ctk cdi generate --output={SPEC}"), said[0]
        assert "No such file or directory" in (tmp_path / f"cdi-after-{step}").read_text()  # not even half a file
    assert "CDI spec" not in _step_output(tmp_path, "systemd"), _step_output(tmp_path, "systemd")
    assert "No such file or directory" in (tmp_path / "cdi-under-systemd").read_text()
