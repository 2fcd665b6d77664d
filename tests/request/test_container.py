import pytest

from nvct.base.errors import RequestError
from nvct.config.file import Config
from nvct.request.container import from_env, from_spec, is_privileged, is_qualified_cdi_name


def req(env, config=None, **kw):
    return from_env(env, config or Config(), **kw)


@pytest.mark.parametrize("value, expected", [
    ("all", ("all",)),
    ("none", ()),
    ("void", None),
    ("", None),
    ("0,1", ("0", "1")),
    (" 0 , 1 ", ("0", "1")),
    ("0,0", ("0",)),             # the reference yields an empty id here
    ("0,all", ("all",)),
    ("none,all", ()),            # the first of all/none wins
    ("all,none", ("all",)),
    ("0,void", None),            # void anywhere wins
    ("GPU-abc,MIG-def,0:1", ("GPU-abc", "MIG-def", "0:1")),
])
def test_visible_devices_precedence(value, expected):
    assert req({"NVIDIA_VISIBLE_DEVICES": value}).devices == expected


def test_unset_visible_devices_is_not_a_gpu_container():
    assert not req({}).is_gpu


def test_legacy_cuda_image_defaults_to_all_devices_and_all_capabilities():
    r = req({"CUDA_VERSION": "11.0.3"})
    assert r.devices == ("all",)
    assert r.legacy_image
    assert set(r.capabilities) == {"compat32", "compute", "display", "graphics", "ngx", "utility", "video"}


def test_image_with_require_cuda_is_not_legacy():
    r = req({"CUDA_VERSION": "12.4.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4"})
    assert r.devices is None


@pytest.mark.parametrize("value, expected", [
    (None, ("compute", "utility")),
    ("", ("compute", "utility")),
    ("utility", ("utility",)),
    ("compute,utility,compute", ("compute", "utility")),
    ("all", ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")),
])
def test_driver_capabilities(value, expected):
    env = {"NVIDIA_VISIBLE_DEVICES": "all"}
    if value is not None:
        env["NVIDIA_DRIVER_CAPABILITIES"] = value
    assert req(env).capabilities == expected


def test_unknown_capability_is_an_error_naming_it():
    with pytest.raises(RequestError, match="NVIDIA_DRIVER_CAPABILITIES: unknown capability 'gpu'"):
        req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,gpu"})


def test_capability_not_supported_by_config_is_an_error():
    config = Config({"supported-driver-capabilities": "utility,compute"})
    with pytest.raises(RequestError, match="'video' is not in this node's supported"):
        req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "video"}, config)


def test_unprivileged_env_request_is_ignored_when_config_says_so():
    config = Config({"accept-nvidia-visible-devices-envvar-when-unprivileged": False})
    assert req({"NVIDIA_VISIBLE_DEVICES": "all"}, config).devices is None
    assert req({"NVIDIA_VISIBLE_DEVICES": "all"}, config, privileged=True).devices == ("all",)


def test_volume_mount_device_list_takes_precedence_when_accepted():
    config = Config({"accept-nvidia-visible-devices-as-volume-mounts": True,
                     "accept-nvidia-visible-devices-envvar-when-unprivileged": False})
    mounts = [
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/GPU-1"},
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0"},
        {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/imex/3"},
        {"source": "/etc/hosts", "destination": "/var/run/nvidia-container-devices/ignored"},
    ]
    r = req({"NVIDIA_VISIBLE_DEVICES": "all"}, config, mounts=mounts)
    assert r.devices == ("GPU-1", "nvidia.com/gpu=0")
    assert r.source == "mounts"
    assert r.imex_channels == ("3",)


def test_volume_mounts_ignored_unless_accepted():
    mounts = [{"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/1"}]
    assert req({"NVIDIA_VISIBLE_DEVICES": "0"}, mounts=mounts).devices == ("0",)


def test_cdi_annotations_take_precedence_sorted_by_key():
    ann = {"cdi.k8s.io/b": "nvidia.com/gpu=1", "cdi.k8s.io/a": "nvidia.com/gpu=0", "other/x": "y"}
    r = req({}, annotations=ann)
    assert r.devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=1")
    assert r.only_cdi_devices


def test_swarm_resource_env_var_is_preferred():
    config = Config({"swarm-resource": "DOCKER_RESOURCE_GPU"})
    r = req({"DOCKER_RESOURCE_GPU": "GPU-9", "NVIDIA_VISIBLE_DEVICES": "all"}, config)
    assert r.devices == ("GPU-9",)
    assert req({"NVIDIA_VISIBLE_DEVICES": "1"}, config).devices == ("1",)


def test_mig_config_requires_privileges():
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"}
    with pytest.raises(RequestError, match="NVIDIA_MIG_CONFIG_DEVICES is set but the container is not privileged"):
        req(env)
    assert req(env, privileged=True).mig_config == ("all",)


def test_imex_channels_and_gated_features():
    r = req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "0,1", "NVIDIA_GDS": "enabled",
             "NVIDIA_MOFED": "enabled", "NVIDIA_NVSWITCH": "disabled"})
    assert r.imex_channels == ("0", "1")
    assert r.features == {"gds", "mofed"}
    assert req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "all"}).imex_channels == ()
    with pytest.raises(RequestError, match="NVIDIA_IMEX_CHANNELS: invalid channel 'x'"):
        req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_IMEX_CHANNELS": "x"})


@pytest.mark.parametrize("caps, expected", [
    ({"bounding": ["CAP_SYS_ADMIN"]}, True),
    ({"bounding": ["CAP_CHOWN"], "effective": ["CAP_SYS_ADMIN"]}, False),
    (["CAP_SYS_ADMIN", "CAP_CHOWN"], True),      # old specs: a flat list
    (None, False),
])
def test_privileged_is_cap_sys_admin_in_bounding_set(caps, expected):
    spec = {"process": {"capabilities": caps}} if caps is not None else {"process": {}}
    assert is_privileged(spec) is expected


def test_from_spec_reads_env_and_last_duplicate_wins():
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]}}
    assert from_spec(spec, Config()).devices == ("1",)


@pytest.mark.parametrize("name, ok", [
    ("nvidia.com/gpu=0", True), ("nvidia.com/gpu=all", True), ("vendor.example/class=dev-1", True),
    ("nvidia.com/gpu=", False), ("nvidia.com=0", False), ("0", False), ("GPU-abc", False),
    ("nvidia.com/gpu/x=0", False),
])
def test_qualified_cdi_names(name, ok):
    assert is_qualified_cdi_name(name) is ok


def test_disable_require():
    r = req({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DISABLE_REQUIRE": "true", "NVIDIA_REQUIRE_CUDA": "cuda>=99"})
    assert r.disable_require
    r = req({"NVIDIA_VISIBLE_DEVICES": "all"}, Config({"disable-require": True}))
    assert r.disable_require


@pytest.mark.parametrize("raw, maybe", [
    (b'{"process":{"env":["PATH=/bin"]}}', False),
    (b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}', True),
    (b'{"process":{"env":["CUDA_VERSION=11.0"]}}', True),
    (b'{"mounts":[{"destination":"/var/run/nvidia-container-devices/0","source":"/dev/null"}]}', True),
    (b'{"annotations":{"cdi.k8s.io/gpu":"nvidia.com/gpu=0"}}', True),
    (b'{"process":{"env":["NVIDIA\\u005fVISIBLE_DEVICES=0"]}}', True),  # an escape: parse to be sure
])
def test_might_request_gpu_never_misses_a_request(raw, maybe):
    from nvct.request.container import might_request_gpu

    assert might_request_gpu(raw, Config()) is maybe


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "0:\u0661", "GPU-\u0663"])
def test_non_ascii_ids_are_refused(value):
    with pytest.raises(RequestError, match="NVIDIA_VISIBLE_DEVICES: invalid value"):
        req({"NVIDIA_VISIBLE_DEVICES": value})


def test_imex_channels_are_ascii_numbers():
    with pytest.raises(RequestError, match="NVIDIA_IMEX_CHANNELS: invalid value"):
        req({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "\u0663"})
    with pytest.raises(RequestError, match="invalid channel '99999999'"):
        req({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "99999999"})


def _imex_mount(name):
    return {"source": "/dev/null", "destination": f"/var/run/nvidia-container-devices/imex/{name}"}


def test_imex_channels_from_volume_mounts_are_validated():
    config = Config({"accept-nvidia-visible-devices-as-volume-mounts": True})
    ok = from_env({"NVIDIA_VISIBLE_DEVICES": "0"}, config, mounts=[_imex_mount("1")])
    assert ok.imex_channels == ("1",)
    with pytest.raises(RequestError, match="IMEX channel volume mount: invalid channel"):
        from_env({"NVIDIA_VISIBLE_DEVICES": "0"}, config, mounts=[_imex_mount("x")])


@pytest.mark.parametrize("name", ["management.nvidia.com/gpu=all", "acme.com/dir=host"])
def test_unprivileged_env_and_annotations_name_nvidia_gpus_only(name):
    for kw in ({}, {"annotations": {"cdi.k8s.io/x": name}}):
        env = {} if kw else {"NVIDIA_VISIBLE_DEVICES": name}
        with pytest.raises(RequestError, match="CAP_SYS_ADMIN"):
            req(env, **kw)
        assert req(env, privileged=True, **kw).devices == (name,)


def test_nvidia_kinds_and_volume_mounts_of_other_vendors_are_fine():
    assert req({"NVIDIA_VISIBLE_DEVICES": "k8s.device-plugin.nvidia.com/gpu=0"}).devices
    config = Config({"accept-nvidia-visible-devices-as-volume-mounts": True})
    mount = {"source": "/dev/null", "destination": "/var/run/nvidia-container-devices/cdi/acme.com/nic/n0"}
    assert from_env({}, config, mounts=[mount]).devices == ("acme.com/nic=n0",)
    with pytest.raises(RequestError, match="privileged containers only"):
        mount["destination"] = "/var/run/nvidia-container-devices/cdi/management.nvidia.com/gpu/all"
        from_env({}, config, mounts=[mount])


def test_annotations_are_ignored_like_the_env_when_locked_down():
    config = Config({"accept-nvidia-visible-devices-envvar-when-unprivileged": False})
    annotations = {"cdi.k8s.io/x": "nvidia.com/gpu=0"}
    assert from_env({}, config, annotations=annotations).devices is None
    assert from_env({}, config, annotations=annotations, privileged=True).devices == ("nvidia.com/gpu=0",)
    assert from_env({}, Config(), annotations=annotations).devices == ("nvidia.com/gpu=0",)
