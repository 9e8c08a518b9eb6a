#!/usr/bin/env bash
# The README's first command: set up, then run the main job on the embedded default
# (a generated SQLite database). Extra args go to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m jobs.main "$@"
