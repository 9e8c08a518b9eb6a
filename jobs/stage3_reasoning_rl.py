"""Stage 3 — reasoning GRPO: single-turn ``<thought>/<solution>`` answers, rewarded by execution.

    python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage3_reasoning_rl --config jobs/configs/stage3.yaml cluster.ray=true

Setup: config, data, the RL data files (verl parquet + task JSONL, tasks whose reference fails are
dropped: ``curriculum.builders.build_stage3``), the actors. Run: ``rl.steps`` GRPO steps — roll out
``tasks_per_step`` tasks × ``group_size`` samples with the current policy, score them with the
(hybrid) reward, update with verl's GRPO loss, sync weights to the rollout workers.
Cleanup: checkpoint ``<run_dir>/stage3/final``, held-out evaluation, ``summary.json``.
"""

from __future__ import annotations

import sys

from jobs.runtime import (Runtime, build_phase, console, finish_stage, parse_stage_args, prepare_data,
                          save_config, stage_logger, train_grpo)


def main(argv: list[str] | None = None) -> dict:
    # -- setup
    cfg = parse_stage_args("stage3", argv, __doc__)
    save_config(cfg)
    data = prepare_data(cfg)
    with Runtime(cfg, data) as rt:
        from curriculum.builders import build_stage3
        from sqlrl.rewards import Judge

        with build_phase(cfg, "checking reference solutions", len(data.train)):
            tasks, report = build_stage3(data.train, cfg.stage_dir, schemas=data.schemas,
                                         judge=Judge(data.catalog))
        console.print(f"[bold]stage3[/bold] data: {report.summary()}")
        if not tasks:
            raise SystemExit("stage3: no training task has a working reference solution")
        # -- run
        logger = stage_logger(rt)
        learner, history = train_grpo(rt, cfg.init_model(), tasks, logger)
        # -- cleanup: checkpoint, evaluation, summary
        return finish_stage(rt, learner, history, logger, {"data_build": report.to_dict()})


if __name__ == "__main__":
    main()
    sys.exit(0)
