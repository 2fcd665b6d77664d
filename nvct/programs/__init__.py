"""The programs named as NVIDIA's, for callers that run them by name.

``nvidia-container-cli`` (containerd's and nerdctl's ``--gpus``, Apptainer's
``--nvccli``, enroot), ``nvidia-cdi-hook`` (hooks in CDI specs written by
NVIDIA's tools), ``nvidia-ctk`` (install guides, automation) and the GPU
Operator's installer entry points. Each maps the reference's command line
onto nvct's own code: none of them has a second implementation of anything.

These run inside container starts (the hooks, ``configure``): standard
library only until the command is known, no click, no ``re``.
"""
