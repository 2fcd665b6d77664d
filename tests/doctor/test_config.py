"""config.*: nvct's config loads, its roots exist, the shim's runtime and hooks are there."""

from __future__ import annotations

import os
import shutil

from nvct import doctor

from .nodes import one, write


def test_a_syntax_error_names_file_and_line_and_stops_the_driver_checks(node):
    with open(node.config) as f:
        lines = f.read().splitlines()
    lines.insert(2, "oops = = 1")
    write(node.config, "\n".join(lines) + "\n")
    findings = node.doctor()
    config = one(findings, "config.file")
    assert config.status == "fail"
    assert config.seen.startswith(f"{node.config}: invalid TOML: line 3, column")
    assert config.fix == f"correct line 3 of {node.config}, then check it with: nvct config show -c {node.config}"
    assert {f.status for f in findings if f.id.startswith(("driver.", "devices.", "libraries."))} == {"info"}
    assert doctor.exit_code(findings) == 1


def test_a_missing_config_means_the_defaults(node, tmp_path):
    config = one(node.doctor(config_path=None, env={"NVIDIA_CTK_CONFIG_FILE_PATH": str(tmp_path / "nope.toml")}),
                 "config.file")
    assert config.status == "info"
    assert config.seen == f"no {tmp_path / 'nope.toml'}: nvct uses its built-in defaults"


def test_a_driver_root_that_does_not_exist_fails_with_the_config_command(node):
    with open(node.config) as f:
        text = f.read()
    write(node.config, text.replace(f'\nroot = "{node.dir}"', '\nroot = "/nonexistent/driver"'))
    roots = one(node.doctor(), "config.roots")
    assert roots.status == "fail"
    assert roots.seen == "driver root /nonexistent/driver (nvidia-container-cli.root) does not exist"
    assert roots.fix.startswith(f"nvct config -c {node.config} --set nvidia-container-cli.root=")


def test_a_missing_low_level_runtime_fails(node):
    with open(node.config) as f:
        text = f.read()
    write(node.config, text.replace('runtimes = ["/bin/true"]', 'runtimes = ["/nonexistent/runc"]'))
    runtimes = one(node.doctor(), "config.runtimes")
    assert runtimes.status == "fail" and "none of ['/nonexistent/runc'] found" in runtimes.seen


def test_legacy_mode_checks_the_prestart_hook_binary(node):
    node.write_config(mode="legacy")
    assert one(node.doctor(), "config.hook").seen == \
        f"legacy mode: containers' hooks run {node.stub('nvidia-container-runtime-hook')}"
    os.unlink(node.stub("nvidia-container-runtime-hook"))
    hook = one(node.doctor(), "config.hook")
    assert hook.status == "fail" and "nvidia-container-runtime-hook.path" in hook.seen


def test_nvidia_ctk_path_names_the_hook_program_unless_nvct_path_is_set(node):
    with open(node.config) as f:
        text = f.read()
    without_nvct_path = text.replace(f'path = "{node.stub("nvct")}"\n', "")
    write(node.config, without_nvct_path + f'\n[nvidia-ctk]\npath = "{node.stub("nvidia-container-runtime")}"\n')
    assert one(node.doctor(), "config.hook").seen == \
        f"auto mode: containers' hooks run {node.stub('nvidia-container-runtime')}"
    write(node.config, without_nvct_path + '\n[nvidia-ctk]\npath = "/bin/true"\n')  # a compiled program
    hook = one(node.doctor(), "config.hook")
    assert (hook.status, hook.seen) == ("fail", "/bin/true (nvidia-ctk.path) is a compiled program, not nvct's "
                                        "nvidia-ctk: NVIDIA's own cannot run nvct's hook chain, so GPU containers "
                                        "would not start")
    assert hook.fix == f"nvct config -c {node.config} --set nvct.path=/usr/bin/nvct -i"
    write(node.config, text + '\n[nvidia-ctk]\npath = "/bin/true"\n')  # nvct.path wins
    assert one(node.doctor(), "config.hook").status == "ok"


def test_logging_to_a_missing_directory_warns(node, tmp_path):
    node.write_config(extra=f'debug = "{tmp_path}/nope/runtime.log"\n')
    log = one(node.doctor(), "config.log")
    assert log.status == "warn" and log.fix == f"mkdir -p {tmp_path}/nope"
    node.write_config(extra=f'debug = "{tmp_path}/runtime.log"\nlog-level = "debug"\n')
    assert one(node.doctor(), "config.log").seen == \
        f"container starts are logged to {tmp_path}/runtime.log (log-level debug)"


def test_a_runc_open_to_cve_2024_45310_warns(node, tmp_path):
    def runc(version):
        path = tmp_path / version / "runc"
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\necho 'runc version {version}+ds1'\necho 'spec: 1.0.2-dev'\n")
        path.chmod(0o755)
        with open(node.config) as f:
            text = f.read()
        write(node.config, text.replace('runtimes = ["/bin/true"]', f'runtimes = ["{path}"]'))
        return str(path)

    old = runc("1.1.5")
    finding = one(node.doctor(), "config.runtime-cve")
    assert finding.status == "warn"
    assert finding.seen.startswith(f"{old} is runc 1.1.5, open to CVE-2024-45310")
    assert finding.fix.startswith("upgrade runc to 1.1.14 or newer, or use crun: nvct config")
    node.write_config()
    runc("1.1.14")
    assert not [f for f in node.doctor() if f.id == "config.runtime-cve"]


def test_unknown_keys_warn_with_the_fix_and_the_config_still_loads(node):
    node.write_config(extra='mod = "legacy"\n')
    findings = node.doctor()
    assert one(findings, "config.file").status == "ok"
    keys = one(findings, "config.keys")
    assert (keys.status, keys.seen, keys.fix) == (
        "warn", f"{node.config}: unknown key 'nvidia-container-runtime.mod', ignored: a typo leaves its setting "
        "at the default", f"correct or remove it in {node.config} ('nvct config default' lists every key)")
    node.write_config()
    assert not [f for f in node.doctor() if f.id == "config.keys"]


def _without_dev_root(node) -> None:
    with open(node.config) as f:
        text = f.read()
    write(node.config, text.replace(f'dev-root = "{node.dir}"\n', ""))


def test_a_missing_driver_root_is_one_failure_when_the_dev_root_follows_it(node):
    _without_dev_root(node)
    with open(node.config) as f:
        text = f.read()
    write(node.config, text.replace(f'\nroot = "{node.dir}"', '\nroot = "/nonexistent/driver"'))
    roots = one(node.doctor(), "config.roots")  # not a second one for the dev root
    assert roots.seen == "driver root /nonexistent/driver (nvidia-container-cli.root) does not exist"


def test_a_driver_root_without_dev_points_at_the_hosts_nodes(node, tmp_path, monkeypatch):
    """Driver files elsewhere, nodes in the host's /dev, no nvct.dev-root: the fix is dev-root = /."""
    from nvct.doctor import devices

    _without_dev_root(node)
    host = tmp_path / "host"
    host.mkdir()
    os.rename(node.path("dev"), host / "dev")
    monkeypatch.setattr(devices, "HOST_ROOT", str(host))
    roots = one(node.doctor(), "config.roots")
    assert roots.status == "fail"
    assert roots.seen == f"dev root {node.dir} (the driver root, as nvct.dev-root is not set) has no dev/"
    assert roots.fix == f"nvct config -c {node.config} --set nvct.dev-root=/ -i (the nodes are in the host's /dev)"


def test_an_ldconfig_that_is_a_script_fails_and_its_real_binary_beside_it_passes(node, tmp_path):
    wrapper = tmp_path / "ldconfig"
    wrapper.write_text("#!/bin/sh\nexec ldconfig.real \"$@\"\n")
    with open(node.config) as f:
        text = f.read()
    cli = "[nvidia-container-cli]\n"
    write(node.config, text.replace(cli, f'{cli}ldconfig = "@{wrapper}"\n', 1))
    check = one(node.doctor(), "config.ldconfig")
    assert (check.status, check.seen) == ("fail", f"ldconfig {wrapper}: not an ELF executable (a wrapper script? on "
                                          f"Ubuntu use '@/sbin/ldconfig.real') (nvidia-container-cli.ldconfig is "
                                          f"'@{wrapper}'): GPU containers fail to start")
    assert check.fix == f"nvct config -c {node.config} --set nvidia-container-cli.ldconfig=@/sbin/ldconfig -i"
    shutil.copy2("/sbin/ldconfig", tmp_path / "ldconfig.real")
    check = one(node.doctor(), "config.ldconfig")
    assert (check.status, check.seen) == ("ok", f"containers' ld caches are built with {wrapper}.real, "
                                          "a static executable")
