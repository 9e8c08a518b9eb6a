"""The stage registry: every curriculum stage is one ``StageSpec`` in ``STAGES``, the one place a
stage is defined.

A stage is its name (``run_dir/<name>``, the config's ``stage:``, ``jobs.main --stages``), its
title, its mode (the prompts, rollouts, default reward and evaluation: ``single`` or ``agentic``),
its data builder (train tasks -> verified training items + a ``BuildReport``), the trainer that
consumes those items (a key of ``jobs.train.TRAINERS``: ``sft`` takes ``SFTExample``s, ``grpo``
takes tasks), its shipped config (a YAML file mirroring ``curriculum.config.StageConfig``) and the
``python -m`` module that ``ray job submit`` runs.

Readers: ``curriculum.config`` (which names are stages, each stage's mode, the previous stage of
``model.init: previous``), ``jobs.stage`` (the one stage recipe), ``jobs.main`` (the order, the
configs, the results table's rows), the thin ``jobs/stage*.py`` entry points, and the tests that
hold docs/curriculum.md and the shipped YAML files to this table.

Guarantees:
- ``STAGES`` is ordered: the curriculum runs in insertion order, and ``previous_stage(name)`` is
  the entry before ``name`` (``None`` for the first).
- Adding a stage = one ``StageSpec`` entry (a data builder here, or any callable with the same
  signature); ``jobs.main``, the configs, the stage recipe and the results table pick it up.
  ``tests/unit/test_stage_registry.py`` proves it with a test-only entry.
- ``stage_spec(name)`` raises ``ValueError`` naming the known stages for an unknown name.
- Nothing here imports ray, torch or the builders at import time (``curriculum.config`` reads this
  module); a builder imports what it needs when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from curriculum.builders import BuildReport
    from curriculum.config import StageConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BuildInputs:
    """What a stage's data builder gets: the run's config, the (mixed) training tasks with their
    database catalog and schemas, and a ``SessionSource`` (``sqlrl.db.source``) of real
    sessions on the job's pool."""

    cfg: "StageConfig"
    tasks: Sequence[Any]
    catalog: Mapping[str, Mapping[str, str]]
    schemas: Mapping[str, Any]
    sessions: Any  # a sqlrl.db.source.SessionSource
    progress: bool = False


Builder = Callable[[BuildInputs], "tuple[list[Any], BuildReport]"]


@dataclass(frozen=True)
class StageSpec:
    name: str  # run_dir/<name>, the config's `stage:`, jobs.main --stages
    title: str  # "reasoning SFT": the results table's row, the plan line, summary.json's title
    mode: str  # "single" | "agentic"
    build: Builder  # train tasks -> training items (SFTExample for sft, tasks for grpo) + report;
    #                 its docstring's first line names the data build in the job's heartbeat
    trainer: str  # a key of jobs.train.TRAINERS: "sft" | "grpo"
    config: str | None = None  # the shipped YAML in jobs/configs/; None: built-in defaults
    job: str | None = None  # the `python -m` module ray job submit runs; None: jobs.main only

    def __post_init__(self) -> None:
        if self.mode not in ("single", "agentic"):
            raise ValueError(f"stage {self.name}: mode must be 'single' or 'agentic', got {self.mode!r}")

    def config_path(self) -> Path | None:
        return ROOT / "jobs" / "configs" / self.config if self.config else None

    @property
    def build_note(self) -> str:
        """What the data build does, in a few words (the builder's docstring's first line)."""
        return (self.build.__doc__ or self.build.__name__).strip().split("\n")[0].rstrip(".")


# -- the data builders (adapters from BuildInputs to curriculum.builders) --------------------------

def _sft_rows(rows: list[dict[str, Any]]) -> list[Any]:
    from sqlrl.learn.batch import SFTExample

    return [SFTExample.from_dict(r) for r in rows]


def build_reasoning_sft(inp: BuildInputs) -> "tuple[list[Any], BuildReport]":
    """Teacher answers, verified by execution (curriculum.builders.build_stage1)."""
    from curriculum.builders import build_stage1

    cfg = inp.cfg
    rows, report = build_stage1(inp.tasks, cfg.teacher.build(cfg.stage_dir), cfg.stage_dir / "sft_data.jsonl",
                                catalog=inp.catalog, schemas=inp.schemas, progress=inp.progress,
                                schema_style=cfg.model.schema_style)
    return _sft_rows(rows), report


def build_tooluse_sft(inp: BuildInputs) -> "tuple[list[Any], BuildReport]":
    """Teacher trajectories on real sessions of the job's pool, verified (build_stage2)."""
    from curriculum.builders import build_stage2

    cfg = inp.cfg
    teacher = cfg.teacher.build(cfg.stage_dir)
    rows, report = build_stage2(inp.tasks, teacher, cfg.stage_dir / "sft_data.jsonl",
                                catalog=inp.catalog, schemas=inp.schemas, progress=inp.progress,
                                max_turns=cfg.rollout.max_turns, sessions=inp.sessions,
                                schema_style=cfg.model.schema_style)
    rows, report = _with_replay(inp, teacher, rows, report)
    return _sft_rows(rows), report


def _with_replay(inp: BuildInputs, teacher: Any, rows: list[dict[str, Any]],
                 report: "BuildReport") -> "tuple[list[dict[str, Any]], BuildReport]":
    """``sft.replay``: add single-turn rows (build_stage1, verified) for the first ``replay``
    fraction of the train tasks, written to replay_data.jsonl. The report counts them too (its
    drops under ``replay-<reason>``, the file as ``files["replay"]``); replay 0 changes nothing."""
    import dataclasses

    from curriculum.builders import build_stage1

    cfg, tasks = inp.cfg, list(inp.tasks)
    n = round(len(tasks) * cfg.sft.replay)
    if n <= 0:
        return rows, report
    path = cfg.stage_dir / "replay_data.jsonl"
    more, rep = build_stage1(tasks[:n], teacher, path, catalog=inp.catalog, schemas=inp.schemas,
                             progress=inp.progress, schema_style=cfg.model.schema_style)
    dropped = dict(report.dropped)
    for reason, count in rep.dropped.items():
        dropped[f"replay-{reason}"] = dropped.get(f"replay-{reason}", 0) + count
    merged = dataclasses.replace(report, total=report.total + rep.total, kept=report.kept + rep.kept,
                                 dropped=dropped, files={**report.files, "replay": str(path)},
                                 outcomes=report.outcomes + rep.outcomes)
    return rows + more, merged


def build_rl_tasks(inp: BuildInputs) -> "tuple[list[Any], BuildReport]":
    """Checking reference solutions; verl parquet + task JSONL in the stage's mode (build_rl_data).

    Tasks whose reference fails its own check are dropped."""
    from curriculum.builders import build_rl_data
    from sqlrl.rewards import Judge
    from sqlrl.tasks.loaders.verl import AGENT_NAME

    cfg = inp.cfg
    agent = AGENT_NAME if cfg.mode == "agentic" else None  # sqlrl's agent loop on verl (actors/verl)
    return build_rl_data(inp.tasks, cfg.stage_dir, cfg.stage, mode=cfg.mode, schemas=inp.schemas,
                         judge=Judge(inp.catalog), agent_name=agent, schema_style=cfg.model.schema_style)


# -- the registry ---------------------------------------------------------------------------------

# In curriculum order. Fields: name, title, mode, data builder, trainer, shipped config, python -m entry.
STAGES: dict[str, StageSpec] = {spec.name: spec for spec in (
    StageSpec("stage1", "reasoning SFT", "single", build_reasoning_sft, "sft", "stage1.yaml", "jobs.stage1_reasoning_sft"),
    StageSpec("stage2", "tool-use SFT", "agentic", build_tooluse_sft, "sft", "stage2.yaml", "jobs.stage2_tooluse_sft"),
    StageSpec("stage3", "reasoning GRPO", "single", build_rl_tasks, "grpo", "stage3.yaml", "jobs.stage3_reasoning_rl"),
    StageSpec("stage4", "agentic GRPO", "agentic", build_rl_tasks, "grpo", "stage4.yaml", "jobs.stage4_agentic_rl"),
)}


def stage_spec(name: str) -> StageSpec:
    spec = STAGES.get(name)
    if spec is None:
        raise ValueError(f"unknown stage {name!r}; known: {', '.join(STAGES)}")
    return spec


def previous_stage(name: str) -> str | None:
    """The stage before ``name`` in the curriculum (``None`` for the first)."""
    names = list(STAGES)
    i = names.index(stage_spec(name).name)
    return names[i - 1] if i else None
