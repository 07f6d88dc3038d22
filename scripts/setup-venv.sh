#!/usr/bin/env bash
# Creates .venv with the pinned Triton and numpy that `triton-check` uses (no torch, no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# Also when the pins moved (a no-op when they are met).
.venv/bin/pip install --quiet --disable-pip-version-check -r python/requirements.txt
.venv/bin/python -c "import triton, numpy; print('triton', triton.__version__, 'numpy', numpy.__version__)"
