#!/usr/bin/env bash
# The GPU environment into the project's environment (.venv), as docs/install.md describes it: uv
# (pinned, from PyPI) → venv → `uv pip sync locks/gpu.txt` (exact versions with hashes, no dependency
# resolution: verl's vLLM + FSDP stack, CUDA torch) → the project itself, editable, without deps → imports.
# Every node of a GPU cluster runs it (cluster.yaml on GPU machines, deploy/aws-gpu.yaml's image,
# deploy/Dockerfile.gpu for deploy/k8s/), so that the driver, the learners and the rollout workers
# share one torch and one Ray. Needs Linux x86-64; a GPU only at run time (the image build has none).
#   PYTHON=/path/to/python3.11   the interpreter the environment is made from (default: python3, >= 3.11)
#   SQLRL_VENV, SQLRL_TOOLS      see scripts/common.sh
# UNVERIFIED: never run to the end on these CPU machines (the lock's CUDA wheels are several GB and
# nothing here could use them); its error cases are tested (tests/packaging/test_cluster_files.py).
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
PY=${PYTHON:-python3}

[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] \
  || sqlrl_die "locks/gpu.txt is for Linux x86-64 (manylinux CUDA wheels); this machine is $(uname -s)-$(uname -m)"
command -v "$PY" >/dev/null 2>&1 \
  || sqlrl_die "no '$PY' on PATH: install Python 3.11 (Debian 12: apt-get install python3) or set PYTHON=/path/to/python3.11"
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null \
  || sqlrl_die "$PY is $("$PY" --version 2>&1); locks/gpu.txt is compiled for CPython 3.11: set PYTHON=/path/to/python3.11"

sqlrl_bootstrap_uv "$PY"
if [ ! -x "$SQLRL_VENV/bin/python" ]; then
  "$UV" venv -q --python "$PY" "$SQLRL_VENV" || sqlrl_die "could not create the environment $SQLRL_VENV with $PY"
fi
"$UV" pip sync -q --python "$SQLRL_VENV/bin/python" locks/gpu.txt \
  || sqlrl_die "installing locks/gpu.txt failed (above): is the package registry reachable?"
"$UV" pip install -q --python "$SQLRL_VENV/bin/python" --no-deps -e . \
  || sqlrl_die "installing the project (editable, no deps) into $SQLRL_VENV failed (above)"
# vLLM is only located, not imported: an image build has no GPU driver to probe.
"$SQLRL_VENV/bin/python" -c "
import importlib.util, ray, torch, verl.trainer.ppo.core_algos, sqlrl
assert importlib.util.find_spec('vllm'), 'vllm is not installed'
print(f'setup_gpu: ok (ray {ray.__version__}, torch {torch.__version__}, {torch.cuda.device_count()} GPU(s) visible)')
" || sqlrl_die "the environment $SQLRL_VENV installed but does not import (above)"
