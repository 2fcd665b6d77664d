#!/usr/bin/env bash
# Runs nvct's whole test suite (installs what it needs first). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
