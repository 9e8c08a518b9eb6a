#!/usr/bin/env bash
# The README's test command: set up (scripts/setup.sh, into .venv), start real PostgreSQL + MariaDB on
# loopback, run the whole suite against them with the project's environment, and stop the servers again
# (also when tests fail). Extra args go to pytest: `-m "not slow"` is the fast tier for local work
# (docs/install.md, "Tests"); with none, every test runs, as CI does. Tests run in a random order
# (pytest-randomly): the seed is printed first and last, `--randomly-seed=N` repeats it.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
bash scripts/setup.sh
sqlrl_activate
bash scripts/dbservers.sh start
trap 'bash scripts/dbservers.sh stop' EXIT
# shellcheck disable=SC1091
source "${SQLRL_DB_DIR:-/tmp/sqlrl-dbs}/env.sh"
export SQLRL_REQUIRE_SERVERS=1  # a missing server fails the run instead of skipping
python -m pytest -q -rs "$@"
