"""Stage 1 — reasoning SFT: imitate a teacher's ``<thought>…</thought><solution>…</solution>`` answers.

    python -m jobs.stage1_reasoning_sft --config jobs/configs/stage1.yaml [key=value ...]
    ray job submit --working-dir . -- python -m jobs.stage1_reasoning_sft --config jobs/configs/stage1.yaml cluster.ray=true

Setup: config, data (train/eval task mixture), teacher. Run: the teacher writes one reasoning
answer per training task; only answers whose SQL passes the task's reward are kept
(``curriculum.builders.build_stage1``); the learner trains on them (loss on the answer tokens only).
Cleanup: the checkpoint goes to ``<run_dir>/stage1/final``, evaluated on held-out tasks;
``summary.json``, ``metrics.jsonl``, TensorBoard files and curves are written.
"""

from __future__ import annotations

import sys

from jobs.runtime import (Runtime, build_phase, console, finish_stage, make_teacher, parse_stage_args,
                          prepare_data, save_config, stage_logger, train_sft)


def main(argv: list[str] | None = None) -> dict:
    # -- setup
    cfg = parse_stage_args("stage1", argv, __doc__)
    save_config(cfg)
    data = prepare_data(cfg)
    teacher = make_teacher(cfg)
    with Runtime(cfg, data) as rt:
        # -- run
        from curriculum.builders import build_stage1
        from sqlrl.learn.batch import SFTExample

        with build_phase(cfg, "teacher answers + verification", len(data.train)):
            rows, report = build_stage1(data.train, teacher, cfg.stage_dir / "sft_data.jsonl",
                                        catalog=data.catalog, schemas=data.schemas,
                                        progress=console.is_terminal)
        console.print(f"[bold]stage1[/bold] data: {report.summary()}")
        if not rows:
            raise SystemExit("stage1: the teacher produced no verified example; see "
                             f"{cfg.stage_dir}/sft_data report")
        logger = stage_logger(rt)
        learner, history = train_sft(rt, cfg.init_model(), [SFTExample.from_dict(r) for r in rows], logger)
        # -- cleanup: checkpoint, evaluation, summary
        return finish_stage(rt, learner, history, logger, {"data_build": report.to_dict()})


if __name__ == "__main__":
    main()
    sys.exit(0)
