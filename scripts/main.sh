#!/usr/bin/env bash
# The README's first command: set up (scripts/setup.sh, into .venv), then run the main job on the
# embedded default (generated SQLite databases) with the project's environment. Extra args go to the job.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$SQLRL_ROOT"
bash scripts/setup.sh
sqlrl_activate
python -m jobs.main "$@"
