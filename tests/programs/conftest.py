"""Fixtures for the drop-in programs' tests (``sim_node`` is suite-wide)."""

from tests.support.fixtures import busybox_image_tar, pause_image_tar, private_podman, rootfs  # noqa: F401 - fixtures
