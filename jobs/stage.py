"""The stage job: one recipe for every curriculum stage, read top to bottom.

    stage_main("stage3", ["--config", "jobs/configs/stage3.yaml", "rl.steps=2"])   # python -m jobs.stage3_*
    run_stage(load_stage_config(path, ["stage=stage3", ...]), config_path=path)   # jobs.main: a typed config

Setup: the config (a ``StageConfig``, parsed once by the caller: ``load_stage_args`` reads
``--config FILE`` + ``key=value`` overrides), checked before any work (``check_stage``); the data
(``jobs.stage_data``); the actors (``jobs.runtime``). Run: the stage's data builder (``StageSpec.build``: verified training items) and its trainer
(``jobs.train.TRAINERS[spec.trainer]``). Cleanup: the checkpoint in ``<run_dir>/<stage>/final``,
its held-out evaluation (``jobs.held_out``: success with its 95% interval, per-task outcomes -- greedy,
plus a sampled ``<mode>@k`` one when ``eval.samples`` is set -- and ``eval_change``, the paired difference against the latest earlier stage evaluated in the same mode),
``summary.json``, metrics and curves.
Which stages exist and what each one does is ``curriculum.stages.STAGES``; the
``jobs/stage*.py`` files are thin ``python -m`` entry points onto this module.

Guarantees:
- A finished result in ``<run_dir>/<stage>`` (``summary.json`` or ``final/``) is never replaced
  without ``overwrite=true``; a bad key, a bad value or a missing start checkpoint is a one-line
  ``SystemExit`` naming the stage, before anything is written or announced.
- Before any work the job prints what it is about to do (stage, run_dir, start, data, steps,
  evaluation, config); the resolved config is saved as ``<run_dir>/<stage>/config.yaml``.
- The checkpoint records its schema rendering (``model.schema_style``, in
  ``final/sqlrl_prompt.json``); a stage refuses to start from a checkpoint that records another.
- A data build that keeps nothing stops the job (``SystemExit`` naming the report) before training.
- With ``checkpoint.every_steps: N`` the trainer saves its full state every N steps in
  ``<stage_dir>/checkpoints`` (``jobs.train.StageCheckpoints``); ``--resume`` / ``resume=true``
  continues a stopped run from the newest one and ends with the same weights as a run never
  stopped (same config and seeds; in-process learner). They are deleted once ``final/`` is saved.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import jobs.held_out as held_out
import jobs.runtime as runtime
import jobs.stage_data as stage_data
from curriculum.config import StageConfig, load_stage_config
from curriculum.stages import BuildInputs, stage_spec
from jobs.console import Heartbeat, quiet_third_party_bars
from jobs.output import build_phase, console, stage_logger
from jobs.train import TRAINERS
from sqlrl import memory
from sqlrl.agent.prompts import record_schema_style


def run_stage(cfg: StageConfig, *, config_path: str | Path | None = None) -> dict[str, Any]:
    """Run the stage ``cfg`` (parsed once by the caller: ``load_stage_args``, or ``jobs.main``)
    read from ``config_path`` (for the plan's line only); returns its summary (also in ``summary.json``)."""
    # -- setup
    check_stage(cfg, config_path)
    spec = cfg.spec
    peak_scope = "stage" if memory.reset_peak() else "process"  # see finish_stage
    save_config(cfg)
    data = stage_data.prepare_data(cfg)
    with runtime.Runtime(cfg, data) as rt:
        # -- run: test suites first (reward.test_suite), the stage's verified training data, then its update loop
        suites = rt.prebuild_suites([*data.train, *data.eval])
        if suites is not None:
            console.print(f"[bold]{cfg.stage}[/bold] test suites: {suites.summary()}")
        with build_phase(cfg, spec.build_note, len(data.train)):
            items, report = spec.build(BuildInputs(cfg, data.train, data.catalog, data.schemas,
                                                   rt.session_source(), progress=console.is_terminal))
        console.print(f"[bold]{cfg.stage}[/bold] data: {report.summary()}")
        if not items:
            raise SystemExit(f"{cfg.stage}: {spec.build_note} kept nothing ({report.summary()}); "
                             f"see the report in {cfg.stage_dir}")
        logger = stage_logger(cfg)
        learner, history = TRAINERS[cfg.trainer_name].train(rt, cfg.init_model(), items, logger)
        # -- cleanup: checkpoint, evaluation, summary
        extra = {"data_build": report.to_dict(), **({"test_suites": suites.to_dict()} if suites else {})}
        return finish_stage(rt, learner, history, logger, extra, peak_scope=peak_scope)


def stage_main(stage: str, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """A ``python -m jobs.stageN_*`` entry point: ``argv`` parsed once, then ``run_stage``."""
    cfg, path = load_stage_args(stage, argv)
    return run_stage(cfg, config_path=path)


def load_stage_args(stage: str, argv: Sequence[str] | None) -> tuple[StageConfig, str | None]:
    """The stage's config from command-line ``argv`` (``--config FILE`` + ``key=value``
    overrides) and the file it was read from; a bad key or value is a one-line ``SystemExit``."""
    from sqlrl.config import ConfigError

    spec = stage_spec(stage)
    ap = argparse.ArgumentParser(prog=f"python -m {spec.job or 'jobs.stage'}",
                                 description=f"{stage} ({spec.title}), a stage of curriculum.stages.STAGES")
    ap.add_argument("--config", default=None, help="a YAML file mirroring curriculum.config.StageConfig "
                                                   f"(shipped: jobs/configs/{spec.config}; none: built-in defaults)")
    ap.add_argument("--resume", action="store_true", help="continue a stopped run of the stage from its newest "
                                                          "checkpoint (resume=true; checkpoint.every_steps)")
    ap.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. rl.steps=2 overwrite=true")
    a = ap.parse_args(argv)
    quiet_third_party_bars()
    try:
        return load_stage_config(a.config, [f"stage={stage}", *a.overrides, *(["resume=true"] if a.resume else [])]), \
            a.config
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"{stage}: {exc}") from None


def parse_stage_args(stage: str, argv: Sequence[str] | None) -> StageConfig:
    """``load_stage_args`` then ``check_stage``: the config, checked, its plan printed."""
    cfg, path = load_stage_args(stage, argv)
    check_stage(cfg, path)
    return cfg


def check_stage(cfg: StageConfig, config_path: str | Path | None = None) -> None:
    """Before any work: no finished result in ``<run_dir>/<stage>`` is replaced without
    ``overwrite=true``, the start checkpoint exists and was trained with this schema rendering
    (each a one-line ``SystemExit`` naming the stage); then the plan is printed."""
    from sqlrl.config import ConfigError

    try:
        check_overwrite(cfg)
        start = cfg.init_model()  # fail now, not after data preparation, when the start checkpoint is missing
        cfg.check_init_style()  # ... or was trained with another schema rendering
        check_trainer(cfg)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"{cfg.stage}: {exc}") from None
    console.print(describe_stage(cfg, start, None if config_path is None else str(config_path)),
                  markup=False, highlight=False)


def check_trainer(cfg: StageConfig) -> None:
    """``ValueError`` when ``trainer`` names no ``TRAINERS`` entry, or one that takes other items
    than the stage's data builder makes (SFT examples vs tasks) or another rollout mode, or the
    config sets what it cannot honour (``Trainer.check``)."""
    chosen, own = TRAINERS.get(cfg.trainer_name), TRAINERS[cfg.spec.trainer]
    if chosen is None:
        raise ValueError(f"trainer {cfg.trainer_name!r} is not one of {', '.join(TRAINERS)}")
    if chosen.takes != own.takes or (chosen.modes and cfg.mode not in chosen.modes):
        raise ValueError(f"trainer {cfg.trainer_name!r} trains on {chosen.takes} in "
                         f"{'/'.join(chosen.modes) or 'any'} mode; {cfg.stage} builds {own.takes} in {cfg.mode} mode")
    chosen.check(cfg)  # the stage's settings it cannot honour


def check_overwrite(cfg: StageConfig) -> None:
    """``SystemExit`` (one line, both ways out) when ``<run_dir>/<stage>`` holds a finished result
    and ``overwrite`` is false."""
    found = cfg.existing_result()
    if found and not cfg.overwrite:
        names = ", ".join(f"{n}/" if n == "final" else n for n in found)
        raise SystemExit(f"{cfg.stage}: {cfg.stage_dir} already holds a result ({names}); not replacing it: "
                         f"pass overwrite=true to replace it, or run_dir=<another folder> to keep it")


def describe_stage(cfg: StageConfig, start: str, config_path: str | None) -> str:
    """What the job is about to do: stage, run_dir, start checkpoint, data, steps, evaluation."""
    d = cfg.data
    source = f"Spider ({d.spider})" if d.spider else f"generated ({d.synth_dir})"
    mixture = ", ".join(f"{k} {v:g}" for k, v in d.mixture.items())
    modes = cfg.eval.modes or (cfg.mode,)
    sampled = [f"{m}@{cfg.eval.samples} (T {cfg.eval.sample_temperature:g})" for m in cfg.eval.sampled_modes(modes)]
    evals = (f"{d.eval_size} held-out tasks, {', '.join([*modes, *sampled])}"
             if cfg.eval.enabled and d.eval_size else "off")
    outputs = f"{cfg.stage_dir}" + (" (replacing its result: overwrite=true)" if cfg.existing_result() else "")
    return "\n".join([
        f"{cfg.stage} ({cfg.spec.title}): about to run",
        f"  run_dir:    {cfg.run_dir} -> outputs in {outputs}",
        f"  start from: {start}",
        f"  data:       {source}: {d.train_size} training tasks, mixture {mixture}",
        f"  steps:      {TRAINERS[cfg.trainer_name].plan(cfg)}",
        f"  evaluation: {evals}",
        f"  config:     {config_path or 'built-in defaults (no --config)'}; "
        f"{'Ray actors' if cfg.cluster.ray else 'in-process'}",
    ])


def save_config(cfg: StageConfig) -> None:
    """Write the resolved config to ``<stage_dir>/config.yaml``. With ``overwrite=true`` the old
    ``summary.json`` goes first, so a run that fails half-way leaves no stale summary behind (the old
    ``final/`` is replaced when the new checkpoint is saved)."""
    from sqlrl.config import dump_config

    cfg.stage_dir.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        (cfg.stage_dir / "summary.json").unlink(missing_ok=True)
    dump_config(cfg, cfg.stage_dir / "config.yaml")


def finish_stage(rt: Any, learner: Any, history: list[dict], logger: Any,
                 extra: Mapping[str, Any] | None = None, *, peak_scope: str = "process") -> dict[str, Any]:
    """Save the final checkpoint to ``<stage_dir>/final``, evaluate it, write ``summary.json``
    (with ``training``: the trainer's ``signal``, what its steps measured).

    The summary's ``peak_rss_gib`` is this process's peak resident memory over the stage
    (``peak_scope: "stage"``) or, where the peak could not be reset, since the process started
    (``"process"``). It is the job's driver: with ``cluster.ray: false`` every worker runs in it;
    on Ray the actors' memory is on the dashboard."""
    from sqlrl.config import to_dict

    cfg = rt.cfg
    final = cfg.stage_dir / "final"
    with Heartbeat(f"{cfg.stage}: saving the checkpoint", note=str(final)):
        learner.save(final, overwrite=True)
    shutil.rmtree(cfg.stage_dir / "checkpoints", ignore_errors=True)  # mid-stage ones: final/ supersedes them
    record_schema_style(final, cfg.model.schema_style)  # inference and serving prompt it the same way
    rt.release(learner)
    curves = logger.close()
    evals: list[dict[str, Any]] = []
    if cfg.eval.enabled and rt.data.eval:
        evals = [e.to_dict() for e in held_out.evaluations(rt, str(final), rt.data.eval, cfg.eval.modes or (cfg.mode,))]
    summary = {"stage": cfg.stage, "title": cfg.spec.title, "checkpoint": str(final),
               "steps": len(history), "data": rt.data.counts(), "source": rt.data.source,
               "last": history[-1] if history else {}, "training": TRAINERS[cfg.trainer_name].signal(history),
               "eval": evals,
               "eval_change": held_out.changes_since_earlier(cfg.run_dir, cfg.stage, evals),
               "curves": [str(p) for p in curves], "peak_rss_gib": memory.peak_gib(), "peak_rss_scope": peak_scope,
               "config": to_dict(cfg), **(extra or {})}
    (cfg.stage_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
