# Sourced by every script: where the project's Python environment lives and which uv builds it.
#   SQLRL_VENV   the project's virtual environment (default: .venv at the repo root, ignored by git)
#   SQLRL_TOOLS  where uv itself is installed from PyPI (default: .cache/tools, ignored by git)
# Every script runs Python from $SQLRL_VENV (activated), never the system interpreter.
SQLRL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SQLRL_VENV=${SQLRL_VENV:-$SQLRL_ROOT/.venv}
SQLRL_TOOLS=${SQLRL_TOOLS:-$SQLRL_ROOT/.cache/tools}
SQLRL_UV_VERSION=0.13.9
UV=$SQLRL_TOOLS/uv-$SQLRL_UV_VERSION/bin/uv
export UV_PYTHON_DOWNLOADS=never UV_NO_PROGRESS=1
# Python keeps its bytecode caches (__pycache__, ignored by git and .rayignore) whatever the calling
# shell says: under PYTHONDONTWRITEBYTECODE=1 (set on the CI machines) every process -- each Ray worker,
# vLLM engine process and job driver -- compiled vllm/torch/transformers from source again on import.
unset PYTHONDONTWRITEBYTECODE
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0  # Ray binds to 127.0.0.1, no usage stats
export PIP_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}  # where the local CPU torch wheel lies
# The lock's CPU torch (torch==2.13.0+cpu) is not on PyPI. It comes from the folder PIP_FIND_LINKS
# names when the wheel is there, else from the torch page of PyTorch's own CPU wheel index (the
# same file: uv checks its sha256 against the lock either way, so a different file fails the sync).
SQLRL_TORCH_WHEEL=torch-2.13.0+cpu
SQLRL_TORCH_CPU_INDEX=${SQLRL_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu/torch/}

sqlrl_die() { echo "$(basename "$0" .sh): error: $*" >&2; exit 1; }

# Bootstrap uv (pinned) into $SQLRL_TOOLS with the given Python's pip; no-op when it is there.
sqlrl_bootstrap_uv() {
  local py=$1
  [ -x "$UV" ] && return 0
  "$py" -m pip install -q --disable-pip-version-check --no-cache-dir --target "$SQLRL_TOOLS/uv-$SQLRL_UV_VERSION" \
    "uv==$SQLRL_UV_VERSION" >/dev/null 2>&1 \
    || sqlrl_die "could not install uv $SQLRL_UV_VERSION from PyPI with $py -m pip: is the package registry reachable (network, proxy, pip.conf)?"
}

# Put the project's environment first on PATH (python, pytest, ray): scripts call this after setup.
sqlrl_activate() {
  [ -x "$SQLRL_VENV/bin/python" ] || sqlrl_die "no environment at $SQLRL_VENV: run 'bash scripts/setup.sh' first"
  # shellcheck disable=SC1091
  VIRTUAL_ENV_DISABLE_PROMPT=1 source "$SQLRL_VENV/bin/activate"
}

# Where uv finds the CPU torch wheel (its --find-links value): the PIP_FIND_LINKS folder when it holds
# the wheel, else PyTorch's CPU index page (a note on stderr says so). Only torch is on that page, so
# every other package still comes from PyPI.
sqlrl_torch_links() {
  if compgen -G "$PIP_FIND_LINKS/$SQLRL_TORCH_WHEEL-*.whl" >/dev/null 2>&1; then
    echo "$PIP_FIND_LINKS"
  else
    echo "$(basename "$0" .sh): $SQLRL_TORCH_WHEEL is not in PIP_FIND_LINKS=$PIP_FIND_LINKS: taking it from PyTorch's CPU wheel index $SQLRL_TORCH_CPU_INDEX (sha256 checked against the lock)" >&2
    echo "$SQLRL_TORCH_CPU_INDEX"
  fi
}
