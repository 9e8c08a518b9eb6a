"""Stage 4 — agentic GRPO: multi-turn tool use on leased sessions, rewarded by the submitted SQL.

    python -m jobs.stage4_agentic_rl --config jobs/configs/stage4.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage4_agentic_rl --config jobs/configs/stage4.yaml cluster.ray=true

Each trajectory leases its own session from its rollout worker's pool partition and calls
``execute_sql`` / ``submit_solution``; the learner updates on the model's tokens only (tool
observations masked) and the new weights go to the rollout workers. What the stage is:
``curriculum.stages.STAGES["stage4"]``; how a stage job runs: ``jobs.stage.run_stage``.
"""

from __future__ import annotations

import sys

from jobs.stage import stage_main


def main(argv: list[str] | None = None) -> dict:
    return stage_main("stage4", argv)


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    main()
    sys.exit(0)
