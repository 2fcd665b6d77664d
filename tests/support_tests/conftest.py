from tests.support.fixtures import (  # noqa: F401 - fixtures
    busybox_image_tar,
    oci_runtime,
    pause_image_tar,
    private_containerd,
    private_dockerd,
    private_podman,
    rootfs,
)
