from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest

from tests.support.image import LAYER_MEDIA_TYPE, SLEEP_FOREVER, ImageSpec, build_image_tar, qualify


@pytest.fixture
def small_rootfs(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\n")
    os.chmod(root / "bin" / "tool", 0o755)
    os.link(root / "bin" / "tool", root / "bin" / "tool2")
    os.symlink("tool", root / "bin" / "alias")
    os.mkfifo(root / "fifo")
    return root


def _members(tar_path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_same_content_gives_the_same_bytes(small_rootfs, tmp_path):
    first = build_image_tar(small_rootfs, tmp_path / "a.tar")
    os.utime(small_rootfs / "bin" / "tool", (12345, 12345))
    second = build_image_tar(small_rootfs, tmp_path / "b.tar")
    assert first.image_ids == second.image_ids
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_is_an_oci_layout_and_a_docker_archive_on_the_same_blobs(small_rootfs, tmp_path):
    info = build_image_tar(small_rootfs, tmp_path / "img.tar", "nvct/x", "v1")
    files = _members(tmp_path / "img.tar")
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"] == {"io.containerd.image.name": "docker.io/nvct/x:v1",
                                    "org.opencontainers.image.ref.name": "v1"}
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    (docker,) = json.loads(files["manifest.json"])
    assert docker["RepoTags"] == ["nvct/x:v1"]
    assert docker["Config"] == "blobs/sha256/" + manifest["config"]["digest"].split(":")[1]
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == LAYER_MEDIA_TYPE
    assert docker["Layers"] == ["blobs/sha256/" + layer["digest"].split(":")[1]]
    config = json.loads(files[docker["Config"]])
    assert config["rootfs"]["diff_ids"] == [layer["digest"]] == [info.layer_digest]
    assert info.image_ids == {"nvct/x:v1": manifest["config"]["digest"]}


def test_layer_keeps_files_links_and_modes_but_no_special_files(small_rootfs, tmp_path):
    build_image_tar(small_rootfs, tmp_path / "img.tar")
    files = _members(tmp_path / "img.tar")
    (docker,) = json.loads(files["manifest.json"])
    layer_path = tmp_path / "layer.tar"
    layer_path.write_bytes(files[docker["Layers"][0]])
    with tarfile.open(layer_path) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert sorted(members) == ["bin", "bin/alias", "bin/tool", "bin/tool2"]
    assert members["bin/tool"].mode == 0o755 and members["bin/tool"].mtime == 0
    assert members["bin/alias"].issym() and members["bin/alias"].linkname == "tool"
    assert members["bin/tool2"].islnk() and members["bin/tool2"].linkname == "bin/tool"
    assert all(m.mtime == 0 and m.uname == "" for m in members.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")
def test_device_nodes_stay_out_of_the_layer(small_rootfs, tmp_path):
    os.mknod(small_rootfs / "null", 0o666 | 0o020000, os.makedev(1, 3))
    build_image_tar(small_rootfs, tmp_path / "img.tar")
    files = _members(tmp_path / "img.tar")
    (docker,) = json.loads(files["manifest.json"])
    (tmp_path / "layer.tar").write_bytes(files[docker["Layers"][0]])
    with tarfile.open(tmp_path / "layer.tar") as layer:
        assert "null" not in layer.getnames()


def test_more_images_share_the_layer(small_rootfs, tmp_path):
    pause = ImageSpec("nvct/pause", cmd=(), entrypoint=SLEEP_FOREVER)
    info = build_image_tar(small_rootfs, tmp_path / "img.tar", also=[pause])
    files = _members(tmp_path / "img.tar")
    docker = json.loads(files["manifest.json"])
    assert [d["RepoTags"] for d in docker] == [["nvct/busybox:latest"], ["nvct/pause:latest"]]
    assert docker[0]["Layers"] == docker[1]["Layers"]
    config = json.loads(files[docker[1]["Config"]])["config"]
    assert config["Entrypoint"] == list(SLEEP_FOREVER) and config["Cmd"] is None
    assert len(set(info.image_ids.values())) == 2


@pytest.mark.parametrize("ref,qualified", [
    ("busybox:1", "docker.io/library/busybox:1"),
    ("nvct/busybox:latest", "docker.io/nvct/busybox:latest"),
    ("localhost/x:1", "localhost/x:1"),
    ("registry.example.com:5000/a/b:c", "registry.example.com:5000/a/b:c"),
])
def test_qualify(ref, qualified):
    assert qualify(ref) == qualified
