"""Infrastructure for nvct's end-to-end tests: real containers, no GPU needed.

``rootfs`` builds a minimal root filesystem, ``bundle`` OCI bundles for
``runtimes`` (runc, crun); ``image`` turns a rootfs into an image tarball that
``docker``, ``containerd`` (ctr and CRI, see ``cri``) and ``podman`` all load
into private daemons/stores. ``fixtures`` wraps them for pytest.
docs/testing.md explains how they fit together.
"""
