"""The OCI hooks.d file that runs nvidia-container-runtime-hook (``--config-mode oci-hook``).

Podman and CRI-O read ``*.json`` hook files (``"version": "1.0.0"``); the hook
runs with exactly the ``env`` given, so PATH is set to the usual system
directories plus the hook's own (the sealed hook environment, docs/security.md).
Deprecated upstream, kept for CRI-O setups that still use it.
"""

from __future__ import annotations

import json
import os

from nvct.base.errors import ConfigError
from nvct.edits.model import HOOK_PATH

DEFAULT_HOOK_BINARY = "/usr/bin/nvidia-container-runtime-hook"


def hook_spec(hook_binary: str = DEFAULT_HOOK_BINARY) -> dict:
    """The hook file's content, in the reference's key order."""
    if not os.path.isabs(hook_binary):
        raise ConfigError(f"{hook_binary}: the NVIDIA runtime hook path must be absolute")
    path_dirs = HOOK_PATH.split(":")
    if os.path.dirname(hook_binary) not in path_dirs:
        path_dirs.append(os.path.dirname(hook_binary))
    return {
        "version": "1.0.0",
        "hook": {
            "path": hook_binary,
            "args": [os.path.basename(hook_binary), "prestart"],
            "env": ["PATH=" + ":".join(path_dirs)],
        },
        "when": {"always": True, "commands": [".*"]},
        "stages": ["prestart"],
    }


def hook_json(hook_binary: str = DEFAULT_HOOK_BINARY) -> str:
    return json.dumps(hook_spec(hook_binary), indent="  ") + "\n"
