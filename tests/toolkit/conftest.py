"""Fixtures for the installer's tests: the images the daemons run (``sim_node`` is suite-wide)."""

from tests.support.fixtures import busybox_image_tar, pause_image_tar  # noqa: F401
