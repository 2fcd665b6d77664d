"""packaging/kubernetes: valid manifests, and a DaemonSet whose command and
settings are what `nvct toolkit install` really accepts."""

from __future__ import annotations

import importlib
import json
import os
import posixpath
from unittest import mock

import click
import pytest
import yaml
from click.core import ParameterSource

from tests.packaging.pkgtest import REPO, containerfile_instructions, project_version

KUBE = REPO / "packaging" / "kubernetes"
KUSTOMIZATION = "kustomization.yaml"
#: Container env that is for the container runtime, not for the installer.
NOT_FOR_THE_INSTALLER = {"NVIDIA_VISIBLE_DEVICES": "void"}
#: Where the host's root is mounted (read-only) in the installer's pod.
HOST_ROOT = "/host"
#: Settings the installer writes into the runtime's config or onto the node: the
#: path must be the host's own, mounted at the same place, writable. Values are
#: whether the setting names a directory (else a file, whose directory counts).
IN_PLACE = {"TOOLKIT_INSTALL_DIR": True, "TOOLKIT_PID_FILE": False, "RUNTIME_CONFIG": False}


def _manifests() -> dict[str, list[dict]]:
    return {p.name: list(yaml.safe_load_all(p.read_text()))
            for p in sorted(KUBE.glob("*.yaml")) if p.name != KUSTOMIZATION}


def _objects() -> list[dict]:
    return [doc for docs in _manifests().values() for doc in docs]


def _one(kind: str) -> dict:
    (obj,) = [o for o in _objects() if o["kind"] == kind]
    return obj


def _pod() -> dict:
    return _one("DaemonSet")["spec"]["template"]["spec"]


def _container() -> dict:
    (container,) = _pod()["containers"]
    return container


def _env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container()["env"]}


def _host_path(container_path: str) -> tuple[str, dict]:
    """The host path behind ``container_path`` and the volumeMount it goes through."""
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    best = None
    for mount in _container()["volumeMounts"]:
        top = mount["mountPath"].rstrip("/") or "/"
        if container_path == top or container_path.startswith(top + "/"):
            if best is None or len(top) > len(best["mountPath"].rstrip("/")):
                best = mount
    assert best is not None, \
        f"{container_path} is on no volume: the installer would use its own image's"
    rest = os.path.relpath(container_path, best["mountPath"])
    host = posixpath.normpath(posixpath.join(volumes[best["name"]]["hostPath"]["path"], rest))
    return host, best


# --------------------------------------------------------------------------- structure


def test_every_manifest_is_yaml_naming_its_kind_and_object():
    for name, docs in _manifests().items():
        assert docs, name
        for doc in docs:
            assert doc.get("apiVersion") and doc.get("kind"), f"{name}: {doc}"
            assert doc["metadata"]["name"], f"{name}: {doc['kind']} without a name"


def test_kustomization_applies_every_manifest():
    kustomization = yaml.safe_load((KUBE / KUSTOMIZATION).read_text())
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(_manifests())


def test_namespaced_objects_live_in_a_namespace_that_allows_privileged_pods():
    namespace = _one("Namespace")
    name = namespace["metadata"]["name"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for obj in _objects():
        if obj["kind"] not in ("Namespace", "RuntimeClass"):
            assert obj["metadata"]["namespace"] == name, obj["kind"]


def test_runtimeclass_nvidia_selects_the_nvidia_handler_on_gpu_nodes():
    runtime_class = _one("RuntimeClass")
    assert runtime_class["apiVersion"] == "node.k8s.io/v1"
    assert runtime_class["metadata"]["name"] == runtime_class["handler"] == "nvidia"
    assert runtime_class["scheduling"]["nodeSelector"] == _pod()["nodeSelector"]


def test_installer_account_has_no_api_token_and_only_the_privileged_scc():
    account = _one("ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert _pod()["serviceAccountName"] == account["metadata"]["name"]
    assert _pod()["automountServiceAccountToken"] is False
    role, binding = _one("Role"), _one("RoleBinding")
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"],
                              "resources": ["securitycontextconstraints"],
                              "resourceNames": ["privileged"], "verbs": ["use"]}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]


def test_daemonset_runs_privileged_with_host_pids_on_every_gpu_node():
    daemonset = _one("DaemonSet")
    template = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = _pod()
    assert pod["hostPID"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert _container()["securityContext"]["privileged"] is True


def test_daemonset_runs_the_installer_image_of_this_version():
    container = _container()
    assert container["image"].rsplit(":", 1)[1] == project_version()
    entrypoint = [json.loads(a) for i, a in containerfile_instructions(
        REPO / "packaging/image/Containerfile") if i == "ENTRYPOINT"]
    # The image's entry program is the reference image's name for the same installer (docs/installer.md)
    assert entrypoint == [["/usr/bin/nvidia-ctk-installer"]]
    assert container["command"] == ["/usr/bin/nvct", "toolkit", "install"]
    assert container.get("args", []) == []


def test_host_paths_are_mounted_where_the_host_has_them():
    pod = _pod()
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in _container()["volumeMounts"]}
    assert volumes.keys() == mounts.keys()
    for name, mount in mounts.items():
        host = volumes[name]["hostPath"]["path"]
        assert mount["mountPath"] == (HOST_ROOT if host == "/" else host), name
    assert mounts[next(n for n, v in volumes.items() if v["hostPath"]["path"] == "/")].get("readOnly")
    assert volumes[_host_path("/run/nvidia/driver")[1]["name"]]["hostPath"]["path"] == "/run/nvidia"
    assert _host_path("/run/nvidia/driver")[1]["mountPropagation"] == "HostToContainer"


def test_installer_paths_are_the_hosts_own_and_writable():
    env = _env()
    assert IN_PLACE.keys() <= env.keys()
    for name, is_dir in IN_PLACE.items():
        path = env[name] if is_dir else posixpath.dirname(env[name])
        host, mount = _host_path(path)
        assert host == path, f"{name}={env[name]}: the host has it at {host}"
        assert not mount.get("readOnly"), f"{name}={env[name]}: mounted read-only"
    # Only connected to: any mount will do, but never the image's own file.
    _host_path(env["RUNTIME_SOCKET"])
    # The driver root is a host path: the pod sees it under the host's root.
    root = env["NVIDIA_DRIVER_ROOT"]
    assert _host_path(posixpath.join(HOST_ROOT, root.lstrip("/")))[0] == posixpath.normpath(root)


def test_runtime_container_env_keeps_gpus_away_from_the_installer():
    env = _env()
    for name, value in NOT_FOR_THE_INSTALLER.items():
        assert env[name] == value
    assert all("valueFrom" not in e for e in _container()["env"])


# --------------------------------------------------------------------------- the installer


def _install_command() -> click.Command:
    """``nvct toolkit install``, as the CLI dispatches it."""
    try:
        toolkit = importlib.import_module("nvct.cli.toolkit")
    except ModuleNotFoundError as e:
        if e.name != "nvct.cli.toolkit":
            raise
        pytest.fail("nvct.cli.toolkit does not exist yet: the DaemonSet's command and env "
                    "cannot be checked against `nvct toolkit install`'s options")
    group = getattr(toolkit, "toolkit_group", None)
    assert isinstance(group, click.Group), \
        "nvct.cli.toolkit has no click group `toolkit_group` (what nvct.cli dispatches `toolkit` to)"
    command = group.get_command(click.Context(group), "install")
    assert command is not None, "`nvct toolkit` has no `install` subcommand"
    return command


def _parse(command: click.Command, args: list[str], env: dict[str, str]) -> click.Context:
    """Parse like the pod's start would, without running the installer."""
    with mock.patch.dict(os.environ, env, clear=True):
        return command.make_context("install", list(args))


def test_daemonset_command_is_nvct_toolkit_install():
    command = _container()["command"]
    assert command[0] == "/usr/bin/nvct" and command[1:] == ["toolkit", "install"]
    _install_command()


def test_daemonset_settings_are_valid_installer_options():
    install = _install_command()
    container = _container()
    try:
        _parse(install, container.get("args", []), _env())
    except click.ClickException as e:
        pytest.fail(f"`nvct toolkit install` rejects the DaemonSet's settings: {e.format_message()}")


@pytest.mark.parametrize("name", sorted(_env()))
def test_each_daemonset_env_var_sets_one_installer_option(name):
    install = _install_command()
    value = _env()[name]
    try:
        ctx = _parse(install, [], {name: value})
    except click.ClickException as e:
        pytest.fail(f"{name}={value}: rejected by `nvct toolkit install`: {e.format_message()}")
    from_env = [p.name for p in install.params
                if ctx.get_parameter_source(p.name) is ParameterSource.ENVIRONMENT]
    if name in NOT_FOR_THE_INSTALLER:
        assert from_env == [], f"{name} is for the container runtime, but sets {from_env}"
    else:
        assert len(from_env) == 1, \
            f"{name} sets {from_env or 'no option'} of `nvct toolkit install` (expected exactly one)"
