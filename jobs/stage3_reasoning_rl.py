"""Stage 3 — reasoning GRPO: single-turn ``<thought>/<solution>`` answers, rewarded by execution.

    python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml cluster.ray=true

Writes the RL data (verl parquet + task JSONL; tasks whose reference fails are dropped), then
``rl.steps`` GRPO steps of ``tasks_per_step`` tasks × ``group_size`` samples, scored by the hybrid
single-turn reward (``jobs.train.train_grpo``). Defined by ``curriculum.stages.STAGES["stage3"]``,
run by ``jobs.stage.stage_main``.
"""

from __future__ import annotations

import sys

from jobs.stage import stage_main


def main(argv: list[str] | None = None) -> dict:
    return stage_main("stage3", argv)


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    main()
    sys.exit(0)
