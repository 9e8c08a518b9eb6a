#!/usr/bin/env bash
# The GPU path in one command, on a machine with one CUDA GPU (docs/verl.md, "GPU check").
#   bash scripts/gpu_check.sh [--full] [--out FILE]
# Uses .venv when it exists (bash scripts/setup_gpu.sh installs the GPU lock there), else the
# python3 on PATH. No network: wheels the machine lacks come from SQLRL_WHEELS (a local folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if [ -n "${SQLRL_WHEELS:-}" ]; then
  "$PY" -m pip install --no-index --find-links "$SQLRL_WHEELS" -r <(ls "$SQLRL_WHEELS" | sed 's/-[0-9].*//') >/dev/null
fi
exec "$PY" scripts/gpu_check.py "$@"
