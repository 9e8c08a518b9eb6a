"""Stage 3 — reasoning GRPO: single-turn ``<thought>/<solution>`` answers, rewarded by execution.

    python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml cluster.ray=true

Writes the RL data (verl parquet + task JSONL; tasks whose reference fails are dropped), then
``rl.steps`` GRPO steps of ``tasks_per_step`` tasks × ``group_size`` samples, scored by the hybrid
single-turn reward (``jobs.train.train_grpo``). Defined by ``curriculum.stages.STAGES["stage3"]``,
run by ``jobs.stage.run_stage``.
"""

from __future__ import annotations

import sys

from jobs.stage import run_stage


def main(argv: list[str] | None = None) -> dict:
    return run_stage("stage3", argv)


if __name__ == "__main__":
    main()
    sys.exit(0)
