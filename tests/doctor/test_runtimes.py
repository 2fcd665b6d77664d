"""runtime.*: docker, containerd and cri-o name an NVIDIA runtime that exists; --gpus finds the hook."""

from __future__ import annotations

import json
import os
import time

from nvct import doctor

from .nodes import containerd_config, crio_drop_in, fake_dockerd, one, write

OURS = "nvidia-container-runtime"


def test_a_daemon_json_runtime_that_does_not_exist_fails_with_the_configure_command(node):
    write(node.docker_config, json.dumps({"runtimes": {"nvidia": {"path": "/usr/bin/nope-runtime"}},
                                          "default-runtime": "nvidia"}))
    findings = node.doctor()
    docker = one(findings, "runtime.docker")
    assert docker.status == "fail"
    assert docker.seen == (f"{node.docker_config}: runtime 'nvidia' runs /usr/bin/nope-runtime, which is not an "
                           f"executable file: GPU containers fail to start")
    assert docker.fix.startswith(f"nvct runtime configure --runtime docker --config {node.docker_config} "
                                 f"--nvidia-runtime-name nvidia --nvidia-runtime-path /")
    assert "then reload dockerd: kill -HUP" in docker.fix
    assert doctor.exit_code(findings) == 1


def test_a_relative_docker_runtime_path_is_looked_up_on_path(node):
    write(node.docker_config, json.dumps({"runtimes": {"nvidia": {"path": OURS}}}))
    assert one(node.doctor(), "runtime.docker").seen == \
        f"{node.docker_config}: runtime 'nvidia' runs {node.stub(OURS)}"


def test_docker_without_an_nvidia_runtime_warns(node):
    write(node.docker_config, "{}")
    docker = one(node.doctor(), "runtime.docker")
    assert docker.status == "warn"
    assert docker.fix.startswith(f"nvct runtime configure --runtime docker --config {node.docker_config}")


def test_a_default_runtime_that_is_not_defined_fails(node):
    write(node.docker_config, json.dumps({"runtimes": {"nvidia": {"path": node.stub(OURS)}},
                                          "default-runtime": "nvidia-cdi"}))
    findings = [f for f in node.doctor() if f.id == "runtime.docker"]
    assert [f.status for f in findings] == ["fail", "ok"]
    assert "the default runtime 'nvidia-cdi' is not defined" in findings[0].seen


def test_invalid_daemon_json_fails(node):
    write(node.docker_config, '{"runtimes": ')
    docker = one(node.doctor(), "runtime.docker")
    assert docker.status == "fail" and "invalid JSON" in docker.seen


def test_missing_engine_configs_are_information_not_failures(node, tmp_path):
    findings = node.doctor(docker_config=str(tmp_path / "none.json"),
                           containerd_config=str(tmp_path / "none.toml"), crio_dir=str(tmp_path / "none.d"))
    for id in ("runtime.docker", "runtime.containerd", "runtime.crio"):
        assert one(findings, id).status == "info"


def test_containerd_imports_are_read_and_the_drop_in_named(node):
    write(node.containerd_config, 'version = 2\nimports = ["conf.d/*.toml"]\n')
    drop_in = os.path.join(os.path.dirname(node.containerd_config), "conf.d/99-nvidia.toml")
    write(drop_in, containerd_config({"nvidia": "/opt/gone/nvidia-container-runtime"}))
    containerd = one(node.doctor(), "runtime.containerd")
    assert containerd.status == "fail"
    assert containerd.seen.startswith(f"{drop_in}: runtime 'nvidia' runs /opt/gone/nvidia-container-runtime")
    assert "then restart containerd" in containerd.fix


def test_containerd_version_3_is_understood(node):
    write(node.containerd_config, containerd_config({"nvidia": node.stub(OURS)}, version=3))
    assert one(node.doctor(), "runtime.containerd").status == "ok"


def test_a_crio_drop_in_whose_runtime_is_gone_fails(node):
    write(os.path.join(node.crio_dir, "99-nvidia.toml"), crio_drop_in("/opt/gone/" + OURS))
    crio = one(node.doctor(), "runtime.crio")
    assert crio.status == "fail"
    assert crio.fix.startswith("nvct runtime configure --runtime crio --drop-in-config ")


def test_gpus_works_when_the_running_dockerd_has_the_hook_on_its_path(node):
    with fake_dockerd(f"{node.bin}:/usr/bin") as (sock, pid):
        gpus = one(node.doctor(docker_socket=sock), "runtime.docker-gpus")
    assert gpus.status == "ok"
    assert gpus.seen.startswith(f"dockerd (pid {pid}, listening on {sock}) finds "
                                f"{node.stub('nvidia-container-runtime-hook')} on its PATH: docker run --gpus works, "
                                f"on the hook path ("), gpus.seen
    assert "has no CDI route for --gpus (it never looks up nvidia-cdi-hook)" in gpus.seen


def test_gpus_fails_when_the_running_dockerd_started_without_the_hook(node, tmp_path):
    os.makedirs(tmp_path / "empty")
    with fake_dockerd(str(tmp_path / "empty")) as (sock, pid):
        gpus = one(node.doctor(docker_socket=sock), "runtime.docker-gpus")
    assert gpus.status == "fail"
    assert f"dockerd (pid {pid}, listening on {sock}) started with PATH={tmp_path / 'empty'}" in gpus.seen
    assert "could not select device driver" in gpus.seen
    assert gpus.fix.startswith("ln -s ") and "restart dockerd" in gpus.fix


def test_a_hook_installed_after_dockerd_started_asks_for_a_restart(node, monkeypatch):
    from nvct.doctor import runtimes

    before = time.time()
    with fake_dockerd(f"{node.bin}:/usr/bin") as (sock, pid):
        started = runtimes._start_time(pid)
        after = time.time()
        monkeypatch.setattr(runtimes, "_start_time", lambda _: os.lstat(node.stub("nvidia-container-runtime-hook"))
                            .st_ctime - 60)
        gpus = one(node.doctor(docker_socket=sock), "runtime.docker-gpus")
    assert gpus.status == "warn"
    assert f"appeared after dockerd (pid {pid}) started" in gpus.seen
    assert gpus.fix == "restart dockerd"
    # The real start time is read from procfs, to within the second of the kernel's boot time:
    # between the moments before the fake dockerd started and after it was asked, however slow.
    assert started is not None and before - 2 <= started <= after + 1


def test_dockerd_is_found_through_its_pidfile_when_the_socket_says_nothing(node, tmp_path):
    with fake_dockerd(f"{node.bin}:/usr/bin") as (_, pid):
        write(str(tmp_path / "docker.pid"), f"{pid}\n")
        gpus = one(node.doctor(docker_pidfile=str(tmp_path / "docker.pid")), "runtime.docker-gpus")
    assert gpus.status == "ok" and f"(pid {pid}, from {tmp_path / 'docker.pid'})" in gpus.seen


def test_without_dockerd_the_default_path_is_checked(node, tmp_path):
    gpus = one(node.doctor(default_path=str(tmp_path)), "runtime.docker-gpus")
    assert gpus.status == "warn"
    assert "has no nvidia-container-runtime-hook: docker run --gpus will fail" in gpus.seen
