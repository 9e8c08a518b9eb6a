"""Stage 4 — agentic GRPO: multi-turn tool use on leased sessions, rewarded by the submitted SQL.

    python -m jobs.stage4_agentic_rl --config jobs/configs/stage4.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage4_agentic_rl --config jobs/configs/stage4.yaml cluster.ray=true

Setup: config, data, the RL data files (verl parquet with ``tools_kwargs`` + task JSONL:
``curriculum.builders.build_stage4``), the actors. Run: ``rl.steps`` GRPO steps — each trajectory
leases its own session from its rollout worker's pool partition, calls ``execute_sql`` and
``submit_solution``; the submitted SQL is scored (hybrid agentic reward), the learner updates with
verl's GRPO loss on the model's tokens only (tool observations are masked), weights are synced.
Cleanup: checkpoint ``<run_dir>/stage4/final``, held-out evaluation, ``summary.json``.
"""

from __future__ import annotations

import sys

from jobs.runtime import (Runtime, build_phase, console, finish_stage, parse_stage_args, prepare_data,
                          save_config, stage_logger, train_grpo)


def main(argv: list[str] | None = None) -> dict:
    # -- setup
    cfg = parse_stage_args("stage4", argv, __doc__)
    save_config(cfg)
    data = prepare_data(cfg)
    with Runtime(cfg, data) as rt:
        from curriculum.builders import build_stage4
        from sqlrl.rewards import Judge

        with build_phase(cfg, "checking reference solutions", len(data.train)):
            tasks, report = build_stage4(data.train, cfg.stage_dir, schemas=data.schemas,
                                         judge=Judge(data.catalog))
        console.print(f"[bold]stage4[/bold] data: {report.summary()}")
        if not tasks:
            raise SystemExit("stage4: no training task has a working reference solution")
        # -- run
        logger = stage_logger(rt)
        learner, history = train_grpo(rt, cfg.init_model(), tasks, logger)
        # -- cleanup: checkpoint, evaluation, summary
        return finish_stage(rt, learner, history, logger, {"data_build": report.to_dict()})


if __name__ == "__main__":
    main()
    sys.exit(0)
