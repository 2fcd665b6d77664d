from tests.support.fixtures import busybox_image_tar  # noqa: F401 (the live daemon tests load it)
