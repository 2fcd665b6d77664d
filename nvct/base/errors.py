"""Errors that reach the operator as one line.

Every entry point catches :class:`NvctError` and prints ``str(error)`` alone:
the message must name the thing at fault (a file, an env var, a device).
"""


class NvctError(Exception):
    """Base class: an error the operator can act on, never a traceback."""


class ConfigError(NvctError):
    """A config file (nvct's or a runtime's) is missing, malformed or invalid."""


class RequestError(NvctError):
    """What the container asks for cannot be understood or is not allowed."""


class DriverError(NvctError):
    """The host's driver installation is missing something that was asked for."""


class RequirementError(NvctError):
    """An ``NVIDIA_REQUIRE_*`` condition is malformed or not met."""

    variable: "str | None" = None  # the variable whose condition failed, where known


class CacheError(NvctError):
    """An ``ld.so.cache`` file is truncated, corrupt or hostile."""


class SpecError(NvctError):
    """An OCI or CDI spec is malformed."""


class ContainerError(NvctError):
    """Realizing edits inside a container failed (mount, mknod, cgroup, ...)."""
