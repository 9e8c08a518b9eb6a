#!/usr/bin/env bash
# Regenerate the lock files from pyproject.toml (the source of version ranges) with uv's resolver:
#   locks/cpu.txt  the CPU environment scripts/setup.sh installs (every extra, torch==2.13.0 CPU build,
#                  vLLM's CPU build from locks/cpu.in, with locks/overrides-cpu.txt)
#   locks/gpu.txt  Linux x86-64 + CUDA: the same plus verl's GPU stack (locks/gpu.in); compiled here,
#                  installed only on GPU machines (UNVERIFIED on the CPU machines this project runs on)
# Both carry sha256 hashes. Run after editing pyproject.toml or locks/*.in|txt inputs, commit the result;
# tests/packaging/test_lock.py fails when a lock no longer satisfies pyproject.toml.
#   bash scripts/lock.sh            # refresh both
#   bash scripts/lock.sh --upgrade  # extra args go to `uv pip compile` (e.g. --upgrade-package ray)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
sqlrl_bootstrap_uv "${PYTHON:-python3}"
EXTRAS=(--extra dev --extra engines --extra mssql --extra oracle --extra ray --extra policy --extra learn --extra models --extra agents)
COMMON=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes --quiet
        --override locks/overrides.txt --custom-compile-command "bash scripts/lock.sh")
"$UV" pip compile pyproject.toml locks/cpu.in "${EXTRAS[@]}" "${COMMON[@]}" --override locks/overrides-cpu.txt \
  -c locks/constraints-cpu.txt --find-links "$(sqlrl_torch_links)" --no-emit-find-links -o locks/cpu.txt "$@"
"$UV" pip compile pyproject.toml locks/gpu.in "${EXTRAS[@]}" "${COMMON[@]}" -o locks/gpu.txt "$@"
echo "lock: wrote locks/cpu.txt ($(grep -c '^[a-z0-9]' locks/cpu.txt) packages), locks/gpu.txt ($(grep -c '^[a-z0-9]' locks/gpu.txt) packages)"
if [ -x "$SQLRL_VENV/bin/python" ]; then "$SQLRL_VENV/bin/python" scripts/check_lock.py
else echo "lock: run scripts/setup.sh, then python scripts/check_lock.py, to check the locks against pyproject.toml"; fi
