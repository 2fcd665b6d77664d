import os

import pytest

from nvct.base.errors import SpecError
from nvct.rootfs import mounttargets


@pytest.fixture
def image(tmp_path):
    root = tmp_path / "rootfs"
    (root / "usr/lib").mkdir(parents=True)
    (root / "data").mkdir()
    os.symlink("usr/lib", root / "lib")
    return root


def _spec(tmp_path, destination="/data"):
    source = tmp_path / "volume"
    source.mkdir(exist_ok=True)
    return {"mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": destination, "type": "bind", "source": str(source),
                        "options": ["rbind", "rw"]}]}


def test_a_target_led_into_an_engine_bind_mount_is_refused(tmp_path, image):
    os.symlink("/data", image / "usr/lib/x86_64-linux-gnu")
    with pytest.raises(SpecError, match="lead /usr/lib/x86_64-linux-gnu into the bind mount at /data"):
        mounttargets.check(_spec(tmp_path), str(image), ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"])


def test_relative_and_dotdot_links_are_followed_inside_the_root(tmp_path, image):
    os.symlink("../../../../data", image / "usr/lib/x86_64-linux-gnu")
    with pytest.raises(SpecError):
        mounttargets.check(_spec(tmp_path), str(image), ["/lib/x86_64-linux-gnu/libcuda.so.1"])


def test_plain_layouts_pass(tmp_path, image):
    (image / "usr/lib/x86_64-linux-gnu").mkdir()
    mounttargets.check(_spec(tmp_path), str(image), ["/lib/x86_64-linux-gnu/libcuda.so.1",
                                                     "/data/named/literally", "/missing/dir/x"])


def test_file_binds_and_other_mount_types_do_not_count(tmp_path, image):
    os.symlink("/etc", image / "usr/lib/x86_64-linux-gnu")
    hosts = tmp_path / "hosts"
    hosts.write_text("")
    spec = {"mounts": [{"destination": "/etc/hosts", "type": "bind", "source": str(hosts)},
                       {"destination": "/etc", "type": "tmpfs", "source": "tmpfs"}]}
    mounttargets.check(spec, str(image), ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"])
