"""The .deb: built from a clean copy of the tree, inspected, linted, then
installed with apt, used to run GPU containers on a simulated node, and purged."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

from nvct.config import file as config
from nvct.programs.version import REFERENCE_VERSION
from tests.packaging.pkgtest import BUILD_ENV, REPO, built_deb, no_driver_config, project_version, tree_modules
from tests.security.test_isolated_start import assert_hooks_start_isolated
from tests.support.bundle import make_bundle, read_config
from tests.support.fixtures import (
    busybox_image_tar,  # noqa: F401 - fixtures
    skip,
)
from tests.support.image import ImageSpec, build_image_tar
from tests.support.legacy_front import age, with_no_cgroups
from tests.support.podman import PODMAN, Podman
from tests.support.proc import SYSTEM_PATH, run
from tests.support.rootfs import BUSYBOX, base_rootfs, make_rootfs
from tests.support.runtimes import CRUN, RUNC, create_start_delete

PROGRAMS = ("nvct", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-cli",
            "nvidia-cdi-hook", "nvidia-ctk", "nvidia-ctk-installer", "nvidia-toolkit")
UNITS = ("/lib/systemd/system/nvidia-cdi-refresh.service", "/lib/systemd/system/nvidia-cdi-refresh.path")
#: The reference's per-mode runtimes: links to the runtime, which takes its mode from its name.
MODE_RUNTIMES = ("/usr/bin/nvidia-container-runtime.cdi", "/usr/bin/nvidia-container-runtime.legacy")
CONFFILE = "/etc/nvidia-container-runtime/config.toml"
OCI_HOOK = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json"
NORMALIZE = "/usr/libexec/nvct/normalize-config"
SITE = "/usr/lib/python3/dist-packages"
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools")
APT_ENV = {**BUILD_ENV, "DEBIAN_FRONTEND": "noninteractive"}
#: What the test containers run: the GPU's device node is there, libcuda loads.
GPU_CHECK = "test -c /dev/nvidia0 && echo has-nvidia0 && dlopen-probe libcuda.so.1"
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=120"]


def _missing_build_deps() -> str:
    if shutil.which("dpkg-checkbuilddeps", path=SYSTEM_PATH) is None:
        return "dpkg-dev"
    result = run(["dpkg-checkbuilddeps", str(REPO / "packaging" / "debian" / "control")],
                 env=BUILD_ENV, timeout=60)
    return "" if result.ok else result.stderr.strip()


_MISSING = _missing_build_deps()
needs_build_tools = pytest.mark.skipif(bool(_MISSING), reason=f"needs the .deb build tools: {_MISSING}")


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> SimpleNamespace:
    """The built package, with its listing, control fields and unpacked tree."""
    out = tmp_path_factory.mktemp("deb")
    modules = tree_modules()  # before the build copies the tree
    path = built_deb(tmp_path_factory)  # once per session: the security tests install it too
    changes = next(path.parent.glob("nvct_*.changes"))
    if os.environ.get("NVCT_TEST_DEB"):  # another build's .deb (an older commit's, to see a test fail)
        (out / "other").mkdir()
        path = Path(shutil.copy(os.environ["NVCT_TEST_DEB"], out / "other" / path.name))
    unpacked = out / "unpacked"
    run(["dpkg-deb", "-x", str(path), str(unpacked)], env=BUILD_ENV).check()
    control = out / "control"
    run(["dpkg-deb", "-e", str(path), str(control)], env=BUILD_ENV).check()
    listing = run(["dpkg-deb", "-c", str(path)], env=BUILD_ENV).check().stdout
    return SimpleNamespace(
        path=path, changes=changes, modules=modules,
        unpacked=unpacked, control=control,
        paths={line.split(None, 5)[5].split(" -> ")[0][1:].rstrip("/") or "/"
               for line in listing.splitlines()},
        fields=_fields(run(["dpkg-deb", "-f", str(path)], env=BUILD_ENV).check().stdout))


def _fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith((" ", "\t")):
            fields[name] += "\n" + line.strip()
        else:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def _names(relations: str) -> set[str]:
    """Package names in a Depends-style field (versions and alternatives dropped)."""
    return {alt.split("(")[0].strip() for rel in relations.split(",") for alt in rel.split("|")}


# --------------------------------------------------------------------------- the .deb itself


@needs_build_tools
def test_deb_is_named_and_versioned_for_the_project(deb):
    version = project_version()
    assert deb.path.name == f"nvct_{version}_all.deb"
    assert (deb.fields["Package"], deb.fields["Version"], deb.fields["Architecture"]) == \
        ("nvct", version, "all")


@needs_build_tools
def test_deb_installs_the_programs_config_hook_and_python_package(deb):
    for link in MODE_RUNTIMES:
        assert os.readlink(deb.unpacked / link[1:]) == "nvidia-container-runtime", link
    wanted = {f"/usr/bin/{p}" for p in PROGRAMS} | set(UNITS) | set(MODE_RUNTIMES) | {
        CONFFILE, OCI_HOOK, NORMALIZE, f"{SITE}/nvct/__init__.py", f"{SITE}/nvct/programs/shim.py",
        f"{SITE}/nvct/programs/hook.py", f"{SITE}/nvct/cli/__init__.py",
        "/usr/share/doc/nvct/copyright"}
    assert wanted <= deb.paths, sorted(wanted - deb.paths)
    for program in [f"/usr/bin/{p}" for p in PROGRAMS] + [NORMALIZE]:
        mode = os.stat(deb.unpacked / program[1:]).st_mode & 0o777
        assert mode == 0o755, f"{program}: mode {mode:o}"
    assert not any("/local/" in p or "site-packages" in p for p in deb.paths)


@needs_build_tools
def test_deb_entries_are_root_owned_and_writable_by_root_alone(deb):
    # built under umask 000 (pkgtest.build_package): dh_fixperms sets the modes
    listing = run(["dpkg-deb", "-c", str(deb.path)], env=BUILD_ENV).check().stdout.splitlines()
    loose = [line for line in listing if line.split()[1] != "root/root"
             or (not line.startswith("l") and (line[5] == "w" or line[8] == "w"))]
    assert listing and loose == []


@needs_build_tools
def test_deb_ships_every_module_of_the_tree(deb):
    shipped = {p[len(SITE) + 1:] for p in deb.paths
               if p.startswith(f"{SITE}/nvct/") and p.endswith(".py")}
    assert shipped == deb.modules


@needs_build_tools
def test_deb_programs_run_debians_python3(deb):
    for program in PROGRAMS:
        text = (deb.unpacked / "usr/bin" / program).read_text()
        first = text.splitlines()[0]
        # sh fronts that start Debian's python3 with -I (a line no packager's shebang rewrite drops)
        assert first == "#!/bin/sh" and "python=/usr/bin/python3" in text, f"/usr/bin/{program}"
        assert '"$python" -I' in text, f"/usr/bin/{program}"


@needs_build_tools
def test_deb_depends_on_debians_python_modules(deb):
    depends = _names(deb.fields["Depends"])
    assert depends >= {"python3:any", "python3-click", "python3-tomlkit", "python3-prctl", "python3-yaml"}
    assert "python3-pyelftools" not in depends, depends  # the tests' ELF reader, not nvct's (docs/packaging.md)


@needs_build_tools
def test_deb_takes_the_place_of_the_nvidia_container_toolkit(deb):
    assert _names(deb.fields["Conflicts"]) == set(TOOLKIT_PACKAGES)
    assert _names(deb.fields["Replaces"]) == set(TOOLKIT_PACKAGES)
    # Versioned, so `Depends: nvidia-container-toolkit (>= 1.x)` holds; exactly the packages whose
    # programs nvct ships (nvidia-container-cli is libnvidia-container-tools'; not libnvidia-container1).
    provides = {p.strip() for p in deb.fields["Provides"].replace("\n", "").split(",")}
    assert provides == {f"{name} (= {REFERENCE_VERSION})" for name in TOOLKIT_PACKAGES}


@needs_build_tools
def test_deb_enables_the_cdi_refresh_units(deb):
    for unit in UNITS:
        text = (deb.unpacked / unit[1:]).read_text()
        assert "WantedBy=multi-user.target" in text
    service = (deb.unpacked / UNITS[0][1:]).read_text()
    assert "ExecStart=/usr/bin/nvidia-ctk cdi generate" in service
    assert "Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml" in service
    assert "PathChanged=/lib/modules/%v/modules.dep" in (deb.unpacked / UNITS[1][1:]).read_text()
    postinst = (deb.control / "postinst").read_text()
    assert "nvidia-cdi-refresh.path" in postinst and "nvidia-cdi-refresh.service" in postinst


@needs_build_tools
def test_deb_config_is_a_conffile_with_the_shipped_content(deb):
    assert (deb.control / "conffiles").read_text().split() == [CONFFILE]
    assert (deb.unpacked / CONFFILE[1:]).read_bytes() == (REPO / "config/config.toml").read_bytes()
    assert (deb.unpacked / OCI_HOOK[1:]).read_bytes() == \
        (REPO / "hooks/oci-nvidia-hook.json").read_bytes()
    assert NORMALIZE in (deb.control / "postinst").read_text()


@needs_build_tools
@pytest.mark.skipif(shutil.which("lintian", path=SYSTEM_PATH) is None, reason="needs lintian")
def test_lintian_finds_no_errors(deb):
    result = run(["lintian", str(deb.changes)], env=BUILD_ENV, timeout=300)
    errors = [line for line in result.stdout.splitlines() if line.startswith("E:")]
    assert result.rc == 0 and not errors, result.describe()


# --------------------------------------------------------------------------- installed


def _dpkg_state(package: str) -> str:
    """``installed``, ``config-files``, ... or ``not-installed``."""
    result = run(["dpkg-query", "-W", "-f", "${db:Status-Status}", package], env=BUILD_ENV)
    return result.stdout.strip() if result.ok and result.stdout.strip() else "not-installed"


def _skip_if_this_machine_has_nvct_or_the_toolkit() -> None:
    """Skip where installing and purging nvct would destroy something of this machine's."""
    for package in ("nvct",) + TOOLKIT_PACKAGES:
        if _dpkg_state(package) != "not-installed":
            skip(f"{package} is on this machine ({_dpkg_state(package)}): "
                        "the test would replace or purge it")
    if os.path.lexists(os.path.dirname(CONFFILE)):
        skip(f"{os.path.dirname(CONFFILE)} exists (the test would change or remove it)")


def _simulated_node(directory: Path) -> str:
    try:
        from nvct.simulate.node import build_node
    except ImportError as e:
        pytest.fail(f"nvct.simulate.node is missing ({e}): no simulated GPU node to run on")
    return build_node(directory)["config"]


def _gpu_container(tmp: Path, name: str, config_path: str, runtime: str = "/usr/bin/nvidia-container-runtime"):
    """Run a container asking for GPU 0 through the installed runtime; return result, spec."""
    bundle = tmp / name
    make_bundle(bundle, make_rootfs(bundle), ["/bin/sh", "-c", GPU_CHECK],
                ["NVIDIA_VISIBLE_DEVICES=0"])
    result = create_start_delete([runtime], bundle, timeout=60,
                                 env={"PATH": SYSTEM_PATH, "NVIDIA_CTK_CONFIG_FILE_PATH": config_path})
    return result, read_config(bundle)


def _check_gpu_container(result, spec, hook_program: str) -> None:
    """``hook_program`` ran, or (jit-cdi: nvct) the installed shim did all the work: the chain before
    the runtime's create, the params mask after it (nvct.modifier.prepare), no hook left."""
    _check_gpu_output(result)
    hooks = [h["path"] for stage in spec.get("hooks", {}).values() for h in stage]
    if hook_program == "nvct" and "/usr/bin/nvct" not in hooks:
        assert hooks == [], hooks
        return
    assert f"/usr/bin/{hook_program}" in hooks, hooks  # the installed programs did the work


def _check_gpu_output(result) -> None:
    assert result.ok, result.describe()
    lines = result.stdout.splitlines()
    assert "has-nvidia0" in lines, result.describe()
    assert any(line.startswith("ok libcuda.so.1 /") for line in lines), result.describe()


def _user_edit(text: str) -> str:
    return text.replace('log-level = "info"', '# debugging node 7\nlog-level = "debug"')


@contextlib.contextmanager
def _installed(deb, purged: list | None = None) -> Iterator[list[str]]:
    """``apt-get install`` the .deb, yield ``dpkg -L nvct``; purge it and check
    that the purge left nothing behind (when the body succeeded). ``purged``
    gets the purge's result."""
    there_before = {p for p in deb.paths if os.path.lexists(p)}
    files: list[str] = []
    # stdin is /dev/null: a conffile prompt would fail the install, not hang it.
    install = run([*APT, "install", "--no-install-recommends", str(deb.path)],
                  env=APT_ENV, timeout=300)
    try:
        assert install.ok, install.describe()
        files = [os.path.normpath(p) for p in
                 run(["dpkg", "-L", "nvct"], env=BUILD_ENV).check().stdout.split()]
        yield files
    finally:
        purge = run([*APT, "purge", "nvct"], env=APT_ENV, timeout=300)
        if purged is not None:
            purged.append(purge)
    assert purge.ok, purge.describe()
    assert _dpkg_state("nvct") == "not-installed"
    left = sorted(p for p in set(files) | deb.paths if p not in there_before and os.path.lexists(p))
    assert left == [], f"left behind by apt-get purge nvct: {left}"
    assert not os.path.lexists(f"{SITE}/nvct")
    assert not os.path.lexists(os.path.dirname(CONFFILE))


def needs_root_and_apt(test):
    for mark in (
        needs_build_tools,
        pytest.mark.skipif(os.geteuid() != 0, reason="needs root (apt-get install, mknod, runc)"),
        pytest.mark.skipif(shutil.which("apt-get", path=SYSTEM_PATH) is None, reason="needs apt-get"),
    ):
        test = mark(test)
    return test


def needs_runc_and_rootfs(test):
    """runc, and what the test container's rootfs (or image) is built from."""
    for mark in (
        pytest.mark.containers,
        pytest.mark.skipif(not os.access(RUNC, os.X_OK), reason=f"needs {RUNC}"),
        pytest.mark.skipif(not os.access(BUSYBOX, os.X_OK) or shutil.which("gcc") is None,
                           reason=f"needs {BUSYBOX} and gcc (the test container's rootfs or image)"),
    ):
        test = mark(test)
    return test


def needs_podman_and_image(test):
    """podman, runc, and what the test image is built from."""
    return needs_runc_and_rootfs(pytest.mark.skipif(not os.access(PODMAN, os.X_OK), reason=f"needs {PODMAN}")(test))


@needs_runc_and_rootfs
@needs_root_and_apt
def test_installed_package_runs_gpu_containers_and_purges_cleanly(deb, tmp_path):
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    node_config = _simulated_node(tmp_path / "node")
    legacy_config = tmp_path / "legacy.toml"
    legacy_config.write_text(Path(node_config).read_text()
                             + '\n[nvidia-container-runtime]\nmode = "legacy"\n')
    with _installed(deb):
        imported = run(["/usr/bin/python3", "-c", "import nvct; print(nvct.__file__)"],
                       env=BUILD_ENV, cwd="/").check().stdout.strip()
        assert imported == f"{SITE}/nvct/__init__.py"
        assert run(["/usr/bin/nvct", "--version"], env=BUILD_ENV).check().stdout.split()[-1] == \
            project_version()
        (tmp_path / "isolated").mkdir()
        assert_hooks_start_isolated("/usr/bin", tmp_path / "isolated")  # no PYTHONHOME/PYTHONPATH takeover
        # Normalization left the untouched conffile byte-for-byte as shipped.
        assert Path(CONFFILE).read_bytes() == (REPO / "config/config.toml").read_bytes()

        _check_gpu_container(*_gpu_container(tmp_path, "jit-cdi", node_config), "nvct")
        _check_gpu_container(*_gpu_container(tmp_path, "legacy", str(legacy_config)),
                             "nvidia-container-runtime-hook")
        # Once the shim recorded an old enough config without device rules to write (no-cgroups), the
        # deb's sh front appends the hook itself: it writes config.json 0600, where Python keeps the
        # engine's mode.
        front_config = tmp_path / "legacy-front.toml"
        front_config.write_text(with_no_cgroups(Path(node_config).read_text())
                                + '\n[nvidia-container-runtime]\nmode = "legacy"\n')
        age(str(front_config))
        run(["/usr/bin/nvidia-container-runtime", "state", "nvct-prime"],
            env={"PATH": SYSTEM_PATH, "NVIDIA_CTK_CONFIG_FILE_PATH": str(front_config)})
        _check_gpu_container(*_gpu_container(tmp_path, "legacy-front", str(front_config)),
                             "nvidia-container-runtime-hook")
        assert os.stat(tmp_path / "legacy-front" / "config.json").st_mode & 0o777 == 0o600
        # the reference's per-mode program: legacy by its name, whatever the config's mode
        _check_gpu_container(*_gpu_container(tmp_path, "by-name", node_config,
                                             runtime="/usr/bin/nvidia-container-runtime.legacy"),
                             "nvidia-container-runtime-hook")

        # Reinstalling (what an upgrade runs) keeps the administrator's edits.
        Path(CONFFILE).write_text(_user_edit(Path(CONFFILE).read_text()))
        edited = config.parse_toml(Path(CONFFILE).read_bytes(), CONFFILE)
        run(["dpkg", "-i", str(deb.path)], env=APT_ENV, timeout=300).check()
        assert config.parse_toml(Path(CONFFILE).read_bytes(), CONFFILE) == edited
        assert "# debugging node 7" in Path(CONFFILE).read_text()


#: An engine config of each kind, as a node has it before nvct.
ENGINE_CONFIGS = {
    "docker": ("docker/daemon.json", '{\n    "log-level": "warn"\n}\n'),
    "containerd": ("containerd/config.toml",
                   'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]'
                   '\nruntime_type = "io.containerd.runc.v2"\n'),
    "crio": ("crio/crio.conf", '[crio.runtime]\ndefault_runtime = "crun"\n'),
}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file (with its bytes) and directory under ``root``."""
    return {str(p.relative_to(root)) + ("/" if p.is_dir() else ""): b"" if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def _engines(root: Path, action: str) -> None:
    for engine, (rel, _) in ENGINE_CONFIGS.items():
        run(["/usr/bin/nvct", "runtime", action, "--runtime", engine, "--config", str(root / rel),
             *(["--set-as-default"] if action == "configure" else [])], env=BUILD_ENV).check()


@needs_root_and_apt
def test_configure_unconfigure_purge_and_configure_purge_leave_no_nvct_entries_nor_files(deb, tmp_path):
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    root = tmp_path / "etc"
    for rel, text in ENGINE_CONFIGS.values():
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_text(text)
    before = _tree(root)
    spec = Path("/var/run/cdi") / f"nvct-test-{os.getpid()}.yaml"  # where nvidia-cdi-refresh generates
    purged: list = []
    with _installed(deb, purged):
        _engines(root, "configure")
        assert "nvidia-container-runtime" in (root / "docker/daemon.json").read_text()
        assert (root / "containerd/conf.d/99-nvidia.toml").exists() and (root / "crio/crio.conf.d").exists()
        _engines(root, "unconfigure")
        assert _tree(root) == before  # configure -> unconfigure: byte for byte, no file or directory left
        _engines(root, "configure")  # configured again, then left to the package's removal
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text('cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices: []\ncontainerEdits:\n  hooks:\n'
                        '  - hookName: createContainer\n    path: /usr/bin/nvct\n    args: [nvct, hook, chain]\n')
    assert _tree(root) == before  # the removal undid every engine's configuration
    assert not spec.exists() and not os.path.lexists("/var/lib/nvct")
    said = (purged[0].stdout + purged[0].stderr).replace("\r\n", "\n")  # dpkg: CR LF
    for engine, (rel, _) in ENGINE_CONFIGS.items():
        restart = {"docker": "dockerd", "crio": "cri-o"}.get(engine, engine)
        assert f"nvct: undid its configuration of {engine} in {root / rel} (restart {restart} to apply)\n" in said
    # the package's own hooks.d file goes with it, and `...runtime` is not `...runtime-hook`
    assert "still names" not in said, said
    assert f"nvct: removed {spec} (a CDI spec whose hooks run nvct's programs)\n" in said


@needs_podman_and_image
@needs_root_and_apt
def test_podman_runs_the_packaged_hook_from_its_default_hooks_directory(deb, tmp_path):
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    node_config = _simulated_node(tmp_path / "node")
    image = ImageSpec()
    build_image_tar(base_rootfs(), tmp_path / "image.tar", image.name, image.tag)
    with _installed(deb):
        # hooks.d hooks get exactly the file's env (PATH): the hook reads the installed config.
        Path(CONFFILE).write_text(Path(node_config).read_text())
        with Podman(runtime=RUNC) as podman:  # podman's own default hooks directory
            podman.load(tmp_path / "image.tar")
            result = podman.run(["--rm", "-e", "NVIDIA_VISIBLE_DEVICES=0", image.qualified_ref,
                                 "sh", "-c", GPU_CHECK])
        _check_gpu_output(result)


@needs_root_and_apt
def test_install_keeps_the_config_the_nvidia_container_toolkit_left(deb):
    # The reference generates its config.toml instead of shipping it: no package owns it.
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    left_by_toolkit = '[nvidia-container-runtime]\nmode = "legacy"\nruntimes = ["runc"]\n'
    os.makedirs(os.path.dirname(CONFFILE))
    try:
        Path(CONFFILE).write_text(left_by_toolkit)
        with _installed(deb):
            assert Path(CONFFILE).read_text() == left_by_toolkit
            assert os.listdir(os.path.dirname(CONFFILE)) == ["config.toml"]
    finally:
        shutil.rmtree(os.path.dirname(CONFFILE), ignore_errors=True)



@needs_podman_and_image
@needs_root_and_apt
def test_podman_runs_a_reference_cdi_spec_through_the_packaged_nvidia_cdi_hook(deb, tmp_path):
    """A spec in the layout NVIDIA's tools write, hooks at /usr/bin/nvidia-cdi-hook: the deb's."""
    import yaml

    from nvct.simulate.node import build_node
    from tests.programs.test_podman_reference_spec import reference_spec
    from tests.support.podman import CDI_DIRS, cdi_spec, unique_cdi_vendor

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    node = build_node(tmp_path / "node")
    image = ImageSpec()
    build_image_tar(base_rootfs(), tmp_path / "image.tar", image.name, image.tag)
    vendor = unique_cdi_vendor()
    with _installed(deb) as files:
        assert "/usr/bin/nvidia-cdi-hook" in files
        with cdi_spec(yaml.safe_dump(reference_spec(node, vendor)), directory=CDI_DIRS[1], suffix=".yaml"), \
                Podman(runtime=RUNC) as podman:
            podman.load(tmp_path / "image.tar")
            result = podman.run(["--rm", "--device", f"{vendor}/gpu=0", image.qualified_ref, "sh", "-c", GPU_CHECK])
        _check_gpu_output(result)


# --------------------------------------------------------------------------- removal that cannot half-fail


def _apt(*args: str, env: dict | None = None, prefix: tuple = ()) -> "object":
    return run([*prefix, *APT, *args], env={**APT_ENV, **(env or {})}, timeout=300)


def _purge_if_installed() -> None:
    if _dpkg_state("nvct") != "not-installed":
        run([*APT, "purge", "nvct"], env=APT_ENV, timeout=300)
        if _dpkg_state("nvct") != "not-installed":  # what a half-failed removal leaves: force it out
            run(["dpkg", "--purge", "--force-all", "nvct"], env=APT_ENV, timeout=300)


@needs_root_and_apt
def test_a_cache_that_cannot_be_removed_never_fails_the_removal(deb):
    """postrm ran ``rm -rf /run/nvct`` under ``set -e``: a start writing the cache failed the purge."""
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    try:
        assert _apt("install", "--no-install-recommends", str(deb.path)).ok
        # A mount inside /run/nvct, in apt's own mount namespace: rm -rf fails on it every time,
        # as it fails now and then when a container start writes the cache while it runs.
        busy = "mkdir -p /run/nvct/busy && mount -t tmpfs nvct-busy /run/nvct/busy && exec \"$@\""
        purge = _apt("purge", "nvct", prefix=("unshare", "-m", "sh", "-c", busy, "sh"))
        assert purge.ok, purge.describe()
        assert _dpkg_state("nvct") == "not-installed"
        said = purge.stdout + purge.stderr
        assert "nvct: could not remove /run/nvct (in use); remove it by hand: rm -rf /run/nvct" in said, said
    finally:
        _purge_if_installed()
        shutil.rmtree("/run/nvct", ignore_errors=True)


def _upgraded(deb, tmp_path: Path) -> Path:
    """The same package at a higher version (what an upgrade unpacks)."""
    tree = tmp_path / "upgraded"
    run(["dpkg-deb", "-R", str(deb.path), str(tree)], env=BUILD_ENV).check()
    control = tree / "DEBIAN" / "control"
    control.write_text(control.read_text().replace(f"Version: {project_version()}\n",
                                                   f"Version: {project_version()}+upgrade1\n"))
    out = tmp_path / f"nvct_{project_version()}+upgrade1_all.deb"
    run(["dpkg-deb", "-b", str(tree), str(out)], env=BUILD_ENV).check()
    return out


@needs_runc_and_rootfs
@needs_root_and_apt
def test_container_starts_during_install_upgrade_remove_and_purge(deb, tmp_path):
    """GPU containers start back to back while apt installs, upgrades, removes and purges nvct:
    every package step succeeds, and while the programs are there every start gets its GPU."""
    import threading

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    node_config = _simulated_node(tmp_path / "node")
    upgraded = _upgraded(deb, tmp_path)
    phase = ["before"]
    starts: list = []
    stop = threading.Event()

    def start_containers() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            at = phase[0]
            try:
                result, _ = _gpu_container(tmp_path / "starts", f"c{n}", node_config)
                ok = result.ok and "has-nvidia0" in result.stdout
                starts.append((at, phase[0], ok, result.describe() if not ok else ""))
            except OSError as e:  # the program is not there (yet, or any more)
                starts.append((at, phase[0], False, str(e)))
            shutil.rmtree(tmp_path / "starts" / f"c{n}", ignore_errors=True)

    (tmp_path / "starts").mkdir()
    starter = threading.Thread(target=start_containers)
    steps = []
    marker = "/run/nvct/.left-by-test"  # the removal takes the whole directory, this with it

    def enter(name: str) -> None:  # phase `name`, until a start began and ended in it (starts run one by one)
        phase[0] = name
        while not [s for s in starts if s[0] == s[1] == name] and starter.is_alive():
            stop.wait(0.05)

    try:
        starter.start()
        for name, args in (("install", ("install", "--no-install-recommends", str(deb.path))),
                           ("upgrade", ("install", "--no-install-recommends", str(upgraded))),
                           ("reinstall", ("install", "--reinstall", "--no-install-recommends", str(upgraded))),
                           ("remove", ("remove", "nvct")),
                           ("purge", ("purge", "nvct"))):
            if name == "remove":
                with open(marker, "x"):  # the starts made /run/nvct
                    pass
            phase[0] = name
            while not [s for s in starts if s[0] == name] and starter.is_alive():  # a start under way in it
                stop.wait(0.05)
            steps.append((name, _apt(*args)))
            enter(f"after {name}")
    finally:
        stop.set()
        starter.join()
        _purge_if_installed()
    for name, result in steps:
        assert result.ok, f"apt {name} failed while containers started: {result.describe()}"
    assert _dpkg_state("nvct") == "not-installed"
    # Between the install and the removal the programs are always there: every start works.
    inside = [s for s in starts if s[0] in ("after install", "upgrade", "after upgrade", "reinstall",
                                            "after reinstall") and s[1] == s[0]]
    assert inside and all(s[2] for s in inside), [s for s in inside if not s[2]][:3]
    # (a start under way during the purge may write its record again: a new directory, without the marker)
    assert not os.path.lexists(marker)
    assert not os.path.lexists("/var/lib/nvct")
    assert not os.path.lexists(f"{SITE}/nvct") and not os.path.lexists(os.path.dirname(CONFFILE))


@pytest.mark.containers  # nvct doctor asks the host's docker
@needs_root_and_apt
def test_an_install_under_umask_000_leaves_nothing_others_can_change(deb):
    import json

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    old = os.umask(0)  # what apt, dpkg and the maintainer scripts (py3compile) inherit
    try:
        install = _apt("install", "--no-install-recommends", str(deb.path))
    finally:
        os.umask(old)
    try:
        assert install.ok, install.describe()
        files = run(["dpkg", "-L", "nvct"], env=BUILD_ENV).check().stdout.split()
        loose = [p for p in files + [str(p) for p in Path(f"{SITE}/nvct").rglob("*")]
                 if os.path.lexists(p) and not os.path.islink(p) and os.lstat(p).st_mode & 0o022]
        assert loose == []
        doctor = run(["/usr/bin/nvct", "doctor", "--json"], env=BUILD_ENV, cwd="/")
        finding = {f["id"]: f for f in json.loads(doctor.stdout)["findings"]}["permissions.chain"]
        assert finding["status"] == "ok", finding
    finally:
        _purge_if_installed()


@pytest.mark.containers
@pytest.mark.parametrize("original", ["explicit", "plain"])
@needs_root_and_apt
def test_purge_takes_a_running_dockerd_off_the_removed_default_runtime(deb, tmp_path, busybox_image_tar, original):
    """``explicit``: daemon.json names its runtimes and default, so a SIGHUP applies the restored file
    (dockerd 20.10 rereads both); ``plain``: it names neither, a reload would keep ``nvidia`` as the
    default, and the removal ends with the one line that says to restart dockerd."""
    from tests.support.docker import Dockerd

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    with _installed(deb), Dockerd() as dockerd:
        dockerd.load(busybox_image_tar)
        if original == "explicit":
            dockerd.reload(runtimes={}, default_runtime="runc")  # "runtimes": {}, "default-runtime": "runc"
        before = Path(dockerd.config_file).read_bytes()
        run(["/usr/bin/nvct", "runtime", "configure", "--runtime", "docker", "--config", dockerd.config_file,
             "--set-as-default"], env=BUILD_ENV).check()
        import signal

        os.kill(dockerd.pid, signal.SIGHUP)
        info = ["info", "--format", "{{.DefaultRuntime}}"]
        from tests.support.proc import wait_until

        assert wait_until(lambda: dockerd.docker(info).stdout.strip() == "nvidia", 20, 0.1)
        assert dockerd.run(["--rm", "nvct/busybox:latest", "true"]).ok  # through nvct's runtime
        purge = _apt("purge", "nvct", env={"DOCKER_HOST": f"unix://{dockerd.socket}"})
        assert purge.ok, purge.describe()
        said = [line for line in (purge.stdout + purge.stderr).replace("\r", "").splitlines()
                if line.startswith("nvct: ")]
        assert Path(dockerd.config_file).read_bytes() == before
        if original == "explicit":
            assert said[-1] == f"nvct: reloaded dockerd (pid {dockerd.pid}): its default runtime is runc", said
            assert dockerd.docker(info).stdout.strip() == "runc"
            result = dockerd.run(["--rm", "nvct/busybox:latest", "echo", "runs"])
            assert result.ok and result.stdout.strip() == "runs", result.describe()
        else:
            assert said[-1] == (f"nvct: dockerd (pid {dockerd.pid}) still runs every container on the removed "
                                "runtime 'nvidia' until it restarts (a reload cannot change that here): "
                                "restart dockerd"), said
            assert dockerd.docker(info).stdout.strip() == "nvidia"  # as the line says; dockerd did not panic
        # reinstall for _installed's purge
        assert _apt("install", "--no-install-recommends", str(deb.path)).ok


# --------------------------------------------------------------------------- the CDI spec without systemd


SPEC = "/var/run/cdi/nvidia.yaml"  # where nvidia-cdi-refresh.service writes it
#: A spec of another vendor's: no hook runs nvct's programs, so the removal leaves it alone.
FOREIGN_SPEC = ('cdiVersion: "0.5.0"\nkind: example.com/dev\ndevices:\n- name: null\n  containerEdits:\n'
                '    deviceNodes:\n    - path: /dev/null\n')


def _apt_without_systemd(run_dir: Path, *args: str, env: dict | None = None):
    """apt in a private mount namespace whose /run is ``run_dir``: no /run/systemd/system, as on a
    host where systemd is not PID 1, and the spec lands in ``run_dir/cdi``, not in this machine's /run."""
    return _apt(*args, env={**(env or {}), "NVCT_TEST_RUN": str(run_dir)},
                prefix=("unshare", "-m", "sh", "-c", 'mount --bind "$NVCT_TEST_RUN" /run && exec "$@"', "sh"))


def _said(result) -> str:
    return (result.stdout + result.stderr).replace("\r\n", "\n")  # dpkg: CR LF


@needs_runc_and_rootfs
@pytest.mark.skipif(not os.access(CRUN, os.X_OK), reason=f"needs {CRUN}")
@needs_root_and_apt
def test_install_without_systemd_writes_the_cdi_spec_containers_get_their_gpu_from(deb, tmp_path):
    """No systemd runs nvidia-cdi-refresh: the postinst writes its spec (the node's driver is found through
    the install's NVIDIA_CTK_CONFIG_FILE_PATH); a CDI request through runc and crun gets GPU 0 from it;
    the purge removes it and leaves another vendor's spec alone."""
    import yaml

    _skip_if_this_machine_has_nvct_or_the_toolkit()
    node_config = _simulated_node(tmp_path / "node")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cdi = run_dir / "cdi"
    try:
        install = _apt_without_systemd(run_dir, "install", "--no-install-recommends", str(deb.path),
                                       env={"NVIDIA_CTK_CONFIG_FILE_PATH": node_config})
        assert install.ok, install.describe()
        assert "nvct: wrote /var/run/cdi/nvidia.yaml (cdiVersion " in _said(install), _said(install)
        assert sorted(os.listdir(cdi)) == ["nvidia.yaml"]  # renamed into place: no temporary file left
        spec = yaml.safe_load((cdi / "nvidia.yaml").read_text())
        assert spec["kind"] == "nvidia.com/gpu" and {"0", "all"} <= {d["name"] for d in spec["devices"]}
        spec_hooks = {h["path"] for h in spec["containerEdits"]["hooks"]}
        assert spec_hooks and spec_hooks <= {f"/usr/bin/{p}" for p in PROGRAMS}, spec_hooks

        for runtime in ("runc", "crun"):  # the shim in cdi mode reads the spec as an engine would
            config_path = tmp_path / f"cdi-{runtime}.toml"
            config_path.write_text(Path(node_config).read_text() + '\n[nvidia-container-runtime]\nmode = "cdi"\n'
                                   f'runtimes = ["{runtime}"]\n[nvidia-container-runtime.modes.cdi]\n'
                                   f'spec-dirs = ["{cdi}"]\n')
            bundle = tmp_path / runtime
            make_bundle(bundle, make_rootfs(bundle), ["/bin/sh", "-c", GPU_CHECK],
                        ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"])
            result = create_start_delete(["/usr/bin/nvidia-container-runtime"], bundle, timeout=60,
                                         env={"PATH": SYSTEM_PATH, "NVIDIA_CTK_CONFIG_FILE_PATH": str(config_path)})
            _check_gpu_output(result)
            hooks = {h["path"] for stage in read_config(bundle).get("hooks", {}).values() for h in stage}
            assert spec_hooks <= hooks, (runtime, hooks)  # the generated spec's edits, not another path

        (cdi / "vendor.yaml").write_text(FOREIGN_SPEC)
        purge = _apt_without_systemd(run_dir, "purge", "nvct")
        assert purge.ok, purge.describe()
        assert f"nvct: removed {SPEC} (a CDI spec whose hooks run nvct's programs)\n" in _said(purge), _said(purge)
        assert sorted(os.listdir(cdi)) == ["vendor.yaml"] and (cdi / "vendor.yaml").read_text() == FOREIGN_SPEC
    finally:
        _purge_if_installed()


@needs_root_and_apt
def test_install_without_systemd_nor_driver_succeeds_with_one_line_and_no_spec(deb, tmp_path):
    _skip_if_this_machine_has_nvct_or_the_toolkit()
    no_driver = no_driver_config(tmp_path)  # a node whose kernel has no NVIDIA module loaded
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        env = {"NVIDIA_CTK_CONFIG_FILE_PATH": str(no_driver)}
        for step in ("install", "reinstall"):  # an upgrade's postinst says it again
            args = ("install", "--no-install-recommends", *(["--reinstall"] if step == "reinstall" else []),
                    str(deb.path))
            install = _apt_without_systemd(run_dir, *args, env=env)
            assert install.ok, install.describe()
            said = [line for line in _said(install).splitlines() if "CDI spec" in line or "cdi generate" in line]
            assert len(said) == 1, (step, _said(install))
            line = said[0]
            assert line.startswith(f"nvct: no CDI spec written to {SPEC} (no systemd here to run "
                                   "nvidia-cdi-refresh): "), line
            assert f"{tmp_path}/no-driver/proc/driver/nvidia/version: not found: the NVIDIA driver is not " \
                "loaded" in line, line
            assert line.endswith(f"; once the driver is loaded, run: nvidia-ctk cdi generate --output={SPEC}"), line
            assert not (run_dir / "cdi").exists() or os.listdir(run_dir / "cdi") == []  # not even half a file
            assert _dpkg_state("nvct") == "installed"
        purge = _apt_without_systemd(run_dir, "purge", "nvct")
        assert purge.ok, purge.describe()
    finally:
        _purge_if_installed()
