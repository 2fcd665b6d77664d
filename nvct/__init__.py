"""nvct: make NVIDIA GPUs usable inside containers."""

__version__ = "0.1.0"
