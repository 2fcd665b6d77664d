#!/usr/bin/env bash
# The main job: run a GPU container through nvidia-container-runtime and runc.
# On a node with an NVIDIA driver it uses the real GPUs; elsewhere it builds a
# simulated GPU node (8 x H100, MIG on GPU 0) first. Extra args go to demo.py
# (e.g. --devices 1,3 --mode legacy).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
