"""Stage 2 — tool-use SFT: imitate ground-truth-guided multi-turn tool trajectories.

    python -m jobs.stage2_tooluse_sft --config jobs/configs/stage2.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage2_tooluse_sft --config jobs/configs/stage2.yaml cluster.ray=true

Setup: config, data, teacher; starts from stage 1's checkpoint (``model.init: previous``). Run:
the teacher writes each assistant turn, every tool call runs on a real leased session and the
model reads the real observation; a trajectory is kept only when its submitted SQL passes
(``curriculum.builders.build_stage2``); the learner trains on the assistant turns only.
Cleanup: the checkpoint goes to ``<run_dir>/stage2/final``, evaluated on held-out tasks;
``summary.json``, ``metrics.jsonl``, TensorBoard files and curves are written.
"""

from __future__ import annotations

import sys

from jobs.runtime import (Runtime, build_phase, console, finish_stage, make_teacher, parse_stage_args,
                          prepare_data, save_config, stage_logger, train_sft)


def main(argv: list[str] | None = None) -> dict:
    # -- setup
    cfg = parse_stage_args("stage2", argv, __doc__)
    save_config(cfg)
    data = prepare_data(cfg)
    teacher = make_teacher(cfg)
    with Runtime(cfg, data) as rt:
        # -- run
        from curriculum.builders import build_stage2, pool_opener
        from sqlrl.learn.batch import SFTExample

        with build_phase(cfg, "teacher trajectories on real sessions + verification", len(data.train)):
            rows, report = build_stage2(data.train, teacher, cfg.stage_dir / "sft_data.jsonl",
                                        catalog=data.catalog, schemas=data.schemas,
                                        progress=console.is_terminal,
                                        max_turns=cfg.rollout.max_turns,
                                        opener=pool_opener(rt.pool.client(role="reward")))
        console.print(f"[bold]stage2[/bold] data: {report.summary()}")
        if not rows:
            raise SystemExit("stage2: the teacher produced no verified example; see "
                             f"{cfg.stage_dir}/sft_data report")
        logger = stage_logger(rt)
        learner, history = train_sft(rt, cfg.init_model(), [SFTExample.from_dict(r) for r in rows], logger)
        # -- cleanup: checkpoint, evaluation, summary
        return finish_stage(rt, learner, history, logger, {"data_build": report.to_dict()})


if __name__ == "__main__":
    main()
    sys.exit(0)
