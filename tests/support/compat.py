"""CUDA forward-compat libcuda files carrying a real ``.note.cuda.fwd_compatibility``.

The note is what NVIDIA's compat packages ship: one ELF note named "NVIDIA
Corporation" whose description is JSON (format, "CUDA version", driver
branches, device: the NVML brand ids of the GPUs it supports). objcopy adds
it as a section to a copy of any ELF library (the simulated node's libcuda,
so the copy still loads).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile


def note_section(note: dict) -> bytes:
    """The section's bytes: an ELF note header, the name and the JSON description, 4-byte aligned."""
    desc = json.dumps(note).encode()
    name = b"NVIDIA Corporation\0"

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % 4)

    return struct.pack("<III", len(name), len(desc), 1) + pad(name) + pad(desc)


def make_compat_libcuda(source: str, dest: str, note: dict | None) -> str:
    """Copy ``source`` to ``dest``, with ``note`` as its compat note (None: no note, as older packages)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if note is None:
        shutil.copy(source, dest)
        return dest
    with tempfile.NamedTemporaryFile(suffix=".note") as f:
        f.write(note_section(note))
        f.flush()
        subprocess.run(["objcopy", "--add-section", f".note.cuda.fwd_compatibility={f.name}",
                        "--set-section-flags", ".note.cuda.fwd_compatibility=noload,readonly", source, dest],
                       check=True, capture_output=True)
    return dest


#: The note of CUDA 13.0's compat package 580.95.05, as read from the package's libcuda on an H200
#: node: its keys are written ``format``, ``CUDA version``, ``driver``, ``device`` (the reference
#: decodes them case-blind, as Go's JSON does).
NOTE_580 = {"format": 1, "CUDA version": "13.0", "driver": [535, 550, 565, 570, 575, 580],
            "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}
#: The notes of the compat packages 575.57.08 (CUDA 12.9) and 590.44.01 (CUDA 13.1), keys as written.
NOTE_575 = {"format": 1, "CUDA version": "12.9", "driver": [535, 550, 560, 565, 570, 575],
            "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}
NOTE_590 = {"format": 1, "CUDA version": "13.1", "driver": [535, 550, 570, 575, 580, 590],
            "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}


#: Two GPUs of brands the real notes treat differently: an H100 (NVML brand 14, "NVIDIA": listed)
#: and a GeForce RTX 4090 (brand 15, "GeForce RTX": no compat package lists it).
MIXED_BRANDS_TOPOLOGY = {
    "models": {
        "H100": {"name": "NVIDIA H100 80GB HBM3", "pci_device_id": "0x233010DE", "brand": 14, "architecture": 9,
                 "compute_capability": "9.0", "memory_mib": 81559, "multiprocessors": 132},
        "RTX4090": {"name": "NVIDIA GeForce RTX 4090", "pci_device_id": "0x268410DE", "brand": 15,
                    "architecture": 8, "compute_capability": "8.9", "memory_mib": 24564, "multiprocessors": 128},
    },
    "gpus": [{"model": "H100", "minor": 0, "bus_id": "0000:1b:00.0"},
             {"model": "RTX4090", "minor": 1, "bus_id": "0000:43:00.0"}],
}


def mixed_brands_node(tmp_path_factory) -> dict:
    """The simulated node of :data:`MIXED_BRANDS_TOPOLOGY` (driver 550.54.15; root, for its device nodes)."""
    from nvct.simulate import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim", topology=MIXED_BRANDS_TOPOLOGY, mig=False)
