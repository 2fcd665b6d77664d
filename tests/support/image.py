"""Container images without a registry.

One uncompressed tarball is both an OCI image layout (for ``ctr images
import``) and a docker-archive (``manifest.json``, for ``docker load`` and
``podman load``), the two sharing the same blobs. Everything is
deterministic -- mtimes 0, sorted entries, root ownership -- so the same
rootfs always gives the same image id in every client.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import Sequence

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
DEFAULT_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
#: Keeps a CRI sandbox ("pause") container alive.
SLEEP_FOREVER = ("/bin/sleep", "2147483647")


@dataclass(frozen=True)
class ImageSpec:
    """One image (name, tag, process defaults) over the shared layer."""

    name: str = "nvct/busybox"
    tag: str = "latest"
    cmd: Sequence[str] = ("sh",)
    entrypoint: Sequence[str] | None = None
    env: Sequence[str] = DEFAULT_ENV

    @property
    def ref(self) -> str:
        """As docker names it: ``nvct/busybox:latest``."""
        return f"{self.name}:{self.tag}"

    @property
    def qualified_ref(self) -> str:
        """As containerd and podman name it: ``docker.io/nvct/busybox:latest``."""
        return qualify(self.ref)


@dataclass
class ImageInfo:
    """What was written: image ids (config digests) by ref, and the layer digest."""

    path: str
    layer_digest: str
    image_ids: dict = field(default_factory=dict)


def qualify(ref: str) -> str:
    """Fully qualify a docker-style reference (``busybox`` -> ``docker.io/library/busybox``)."""
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return ref
    if not rest:
        return f"docker.io/library/{ref}"
    return f"docker.io/{ref}"


def build_image_tar(rootfs_dir: str | os.PathLike, out_tar: str | os.PathLike,
                    name: str = "nvct/busybox", tag: str = "latest", *,
                    cmd: Sequence[str] = ("sh",), entrypoint: Sequence[str] | None = None,
                    also: Sequence[ImageSpec] = ()) -> ImageInfo:
    """Write ``out_tar`` holding ``name:tag`` (and each of ``also``) over one layer of ``rootfs_dir``.

    Device nodes, fifos and sockets are left out of the layer.
    """
    out_tar = os.fspath(out_tar)
    specs = [ImageSpec(name, tag, tuple(cmd), entrypoint and tuple(entrypoint)), *also]
    with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(out_tar))) as layer:
        _write_layer(os.fspath(rootfs_dir), layer)
        layer_size = layer.tell()
        layer.seek(0)
        layer_digest = _sha256_file(layer)
        layer.seek(0)
        info = ImageInfo(path=out_tar, layer_digest=layer_digest)
        blobs: dict[str, bytes] = {}
        index_entries, docker_entries = [], []
        for spec in specs:
            config = _json(_image_config(spec, layer_digest))
            config_digest = _add_blob(blobs, config)
            manifest = _json({
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest,
                           "size": len(config)},
                "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest,
                            "size": layer_size}],
            })
            manifest_digest = _add_blob(blobs, manifest)
            index_entries.append({
                "mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest,
                "size": len(manifest),
                "annotations": {"io.containerd.image.name": spec.qualified_ref,
                                "org.opencontainers.image.ref.name": spec.tag},
            })
            docker_entries.append({"Config": _blob_path(config_digest),
                                   "RepoTags": [spec.ref],
                                   "Layers": [_blob_path(layer_digest)]})
            info.image_ids[spec.ref] = config_digest
        index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE,
                 "manifests": index_entries}
        with tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_dir(tar, "blobs")
            _add_dir(tar, "blobs/sha256")
            _add_file(tar, _blob_path(layer_digest), layer, layer_size)
            for digest in sorted(blobs):
                _add_bytes(tar, _blob_path(digest), blobs[digest])
            _add_bytes(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
            _add_bytes(tar, "index.json", _json(index))
            _add_bytes(tar, "manifest.json", _json(docker_entries))
    return info


def _image_config(spec: ImageSpec, layer_digest: str) -> dict:
    process: dict = {"Env": list(spec.env), "Cmd": list(spec.cmd) or None,
                     "WorkingDir": "/"}
    if spec.entrypoint is not None:
        process["Entrypoint"] = list(spec.entrypoint)
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": process,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z",
                     "created_by": "nvct tests: base rootfs"}],
    }


def _write_layer(rootfs: str, fileobj) -> None:
    """Tar ``rootfs`` deterministically, skipping what a layer must not carry."""
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk_sorted(rootfs):
            rel = os.path.relpath(path, rootfs)
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                    or stat.S_ISLNK(st.st_mode)):
                continue
            info = tar.gettarinfo(path, arcname=rel)
            info.mtime = 0
            info.uname = info.gname = ""
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def _walk_sorted(top: str):
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            yield os.path.join(dirpath, name)


def _sha256_file(f) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


def _json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _add_blob(blobs: dict, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest


def _blob_path(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    _add_file(tar, name, io.BytesIO(data), len(data))


def _add_file(tar: tarfile.TarFile, name: str, f, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    tar.addfile(info, f)
