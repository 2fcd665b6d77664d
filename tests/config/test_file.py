import os

import pytest

from nvct.base.errors import ConfigError
from nvct.config import file as config


def test_defaults_match_the_reference():
    c = config.Config()
    assert c.mode == "auto"
    assert c.runtimes == ["runc", "crun"]
    assert c.get("accept-nvidia-visible-devices-envvar-when-unprivileged") is True
    assert c.get("nvidia-container-runtime.modes.cdi.spec-dirs") == ["/etc/cdi", "/var/run/cdi"]
    assert c.get("nvidia-container-runtime-hook.path") == "nvidia-container-runtime-hook"
    assert (c.driver_root, c.dev_root, c.proc_root) == ("/", "/", "/proc")


def test_lookup_order(fs):
    fs.create_file("/explicit.toml", contents='[nvidia-container-runtime]\nmode = "legacy"\n')
    fs.create_file("/env.toml", contents='[nvidia-container-runtime]\nmode = "cdi"\n')
    fs.create_file("/xdg/nvidia-container-runtime/config.toml",
                   contents='[nvidia-container-runtime]\nmode = "jit-cdi"\n')
    fs.create_file("/etc/nvidia-container-runtime/config.toml", contents="disable-require = true\n")
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": "/env.toml", "XDG_CONFIG_HOME": "/xdg"}
    assert config.load("/explicit.toml", env=env).mode == "legacy"
    assert config.load(env=env).mode == "cdi"
    assert config.load(env={"XDG_CONFIG_HOME": "/xdg"}).mode == "jit-cdi"
    assert config.load(env={}).get("disable-require") is True


def test_missing_default_file_means_defaults(fs):
    c = config.load(env={})
    assert c.path is None and c.mode == "auto"


def test_missing_explicit_file_is_an_error(fs):
    with pytest.raises(ConfigError, match="/nope.toml: config file not found"):
        config.load("/nope.toml", env={})


def test_malformed_file_names_file_and_line(fs):
    fs.create_file("/bad.toml", contents='disable-require = false\n[nvidia-container-runtime\nmode = "x"\n')
    with pytest.raises(ConfigError) as e:
        config.load("/bad.toml", env={})
    msg = str(e.value)
    assert msg.startswith("/bad.toml: invalid TOML: line 2")
    assert "\n" not in msg


def test_unknown_mode_is_an_error(fs):
    fs.create_file("/c.toml", contents='[nvidia-container-runtime]\nmode = "magic"\n')
    with pytest.raises(ConfigError, match="unknown mode 'magic'"):
        config.load("/c.toml", env={})


def test_roots_from_file_and_env_overrides(fs):
    fs.create_file("/c.toml", contents='[nvidia-container-cli]\nroot = "/run/nvidia/driver"\n'
                                        '[nvct]\ndev-root = "/d"\nproc-root = "/p"\n')
    c = config.load("/c.toml", env={})
    assert (c.driver_root, c.dev_root, c.proc_root) == ("/run/nvidia/driver", "/d", "/p")
    c = config.load("/c.toml", env={"NVCT_DRIVER_ROOT": "/x", "NVCT_DEV_ROOT": "/y", "NVCT_PROC_ROOT": "/z"})
    assert (c.driver_root, c.dev_root, c.proc_root) == ("/x", "/y", "/z")


def test_dev_root_is_the_driver_root_unless_set(fs):
    """The reference's rule: /dev nodes are looked for under the driver root (the GPU Operator's layout)."""
    fs.create_file("/c.toml", contents='[nvidia-container-cli]\nroot = "/run/nvidia/driver"\n')
    c = config.load("/c.toml", env={})
    assert (c.dev_root, c.dev_root_source) == ("/run/nvidia/driver", "the driver root, as nvct.dev-root is not set")
    assert config.load("/c.toml", env={"NVCT_DRIVER_ROOT": "/x"}).dev_root == "/x"
    c = config.load("/c.toml", env={"NVCT_DEV_ROOT": "/"})
    assert (c.dev_root, c.dev_root_source) == ("/", "set by NVCT_DEV_ROOT")
    fs.create_file("/d.toml", contents='[nvidia-container-cli]\nroot = "/run/nvidia/driver"\n[nvct]\ndev-root = "/"\n')
    c = config.load("/d.toml", env={})
    assert (c.driver_root, c.dev_root, c.dev_root_source) == ("/run/nvidia/driver", "/", "set by nvct.dev-root")


def test_reference_config_file_is_accepted(fs):
    # The file NVIDIA's packages install, verbatim keys.
    fs.create_file("/c.toml", contents='''
accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
#debug = "/var/log/nvidia-container-toolkit.log"
environment = []
ldconfig = "@/sbin/ldconfig"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]

[nvidia-container-runtime.modes.csv]
mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"

[nvidia-container-runtime-hook]
path = "nvidia-container-runtime-hook"
skip-mode-detection = false

[nvidia-ctk]
path = "nvidia-ctk"
''')
    c = config.load("/c.toml", env={})
    assert c.runtimes == ["docker-runc", "runc", "crun"]
    assert c.get("nvidia-container-cli.ldconfig") == "@/sbin/ldconfig"


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="a read lease on another's file needs CAP_LEASE")
def test_a_config_open_for_writing_is_an_error_naming_it_never_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "_WRITER_WAIT_S", 0.05)
    path = tmp_path / "config.toml"
    path.write_text('[nvidia-container-runtime]\nmode = "legacy"\n')
    with open(path, "wb") as writer:  # truncated, its writer not done
        writer.write(b"# nvct\n")
        writer.flush()
        with pytest.raises(ConfigError, match=f"^{path}: being written by another process"):
            config.load(str(path))
    assert config.load(str(path)).mode == "auto"  # closed: what it wrote is the config
