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
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0  # Ray binds to 127.0.0.1, no usage stats
export PIP_FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}  # where the local CPU torch wheel lies

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
