"""Stage 2 — tool-use SFT: imitate ground-truth-guided multi-turn tool trajectories.

    python -m jobs.stage2_tooluse_sft --config jobs/configs/stage2.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage2_tooluse_sft --config jobs/configs/stage2.yaml cluster.ray=true

Starts from stage 1's checkpoint (``model.init: previous``). The teacher writes each assistant
turn, every tool call runs on a real session leased from the job's pool and the model reads the
real observation; a trajectory is kept only when its submitted SQL passes
(``curriculum.builders.build_stage2``), and the learner trains on the assistant turns.
Registry entry: ``curriculum.stages.STAGES["stage2"]``; recipe: ``jobs.stage.run_stage``.
"""

from __future__ import annotations

import sys

from jobs.stage import stage_main


def main(argv: list[str] | None = None) -> dict:
    return stage_main("stage2", argv)


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    main()
    sys.exit(0)
