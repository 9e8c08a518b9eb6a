"""Stage 1 — reasoning SFT: imitate a teacher's ``<thought>…</thought><solution>…</solution>`` answers.

    python -m jobs.stage1_reasoning_sft --config jobs/configs/stage1.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage1_reasoning_sft --config jobs/configs/stage1.yaml cluster.ray=true

The teacher (``teacher.kind``) writes one reasoning answer per training task; only answers whose
SQL passes the task's reward are kept (``curriculum.builders.build_stage1``), and the learner
trains on the answer tokens. The stage is ``curriculum.stages.STAGES["stage1"]``; the recipe
(setup, run, cleanup) is ``jobs.stage.run_stage``.
"""

from __future__ import annotations

import sys

from jobs.stage import stage_main


def main(argv: list[str] | None = None) -> dict:
    return stage_main("stage1", argv)


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    main()
    sys.exit(0)
