"""One training step from traces: a step's ``RolloutTrace`` values -> the learner's batch and the metrics.

``jobs/train_agent.py`` (the job: engine, gateway, DB pool, learner) calls ``build_step`` once per
GRPO step with the traces the gateway recorded for that step's groups, then, when ``StepBuild.batch``
is not None, ``learner.step(batch, "grpo", loss)`` as many times as it updates per batch, and logs
``StepBuild.metrics``. Ray-free, engine-free: everything here is a pure function of the traces.

Guarantees:
- Rows and advantages are ``sqlrl.gateway.sequences.training_rows``'s: one verl GRPO advantage per
  rollout over its group, shared by all of that rollout's trained sequences; expired / failed
  rollouts follow ``SequenceConfig.unfinished``.
- Group filtering, as the built-in GRPO loop does it (``sqlrl.learn.groups``): a group trains only
  with at least ``min_group_size`` rollouts in it (verl's group-of-one advantage is the raw reward,
  not a comparison), and, with ``drop_equal_groups``, only when its rewards differ (equal rewards
  give zero advantages: no gradient, only a diluted token-mean loss). The rest are counted
  (``groups_drawn`` / ``groups_trained`` / ``groups_signal``), never silently lost.
- ``StepBuild.batch`` is None exactly when no row is left to train (the metrics say why);
  otherwise it is ``rl_batch`` of the kept rows with their rollout advantages.
- ``metrics`` has a fixed key order (a metrics.jsonl line): the rollouts (completed / expired /
  failed, and of those failed, ``setup_failed``: their task's setup SQL failed), reward mean, pass rate (``sqlrl.rl.outcome.solved`` on the judge's reward parts: the one
  definition of success) and each reward part over the completed rollouts; calls, tokens, merges,
  mismatches by cause (every cause of ``MISMATCH_CAUSES``, 0 when none), length drops, calls that
  never finished; groups and rows trained.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from sqlrl.learn.config import GRPOConfig
from sqlrl.rl.outcome import mean, solved

from .sequences import MISMATCH_CAUSES, SequenceConfig, TraceRows, training_rows
from .trace import RolloutTrace

__all__ = ["StepBuild", "TraceTrainConfig", "build_step", "step_metrics", "trained_groups"]


@dataclass(frozen=True)
class TraceTrainConfig:
    """How a step's traces become its update (``sequences``: merging, tags, unfinished rollouts)."""

    sequences: SequenceConfig = field(default_factory=SequenceConfig)
    min_group_size: int = 2  # in-group rollouts a group needs to train
    drop_equal_groups: bool = True  # skip groups whose rewards are all equal (zero advantages)

    def __post_init__(self) -> None:
        if not isinstance(self.sequences, SequenceConfig):
            raise ValueError(f"TraceTrainConfig.sequences must be a SequenceConfig, got {self.sequences!r}")
        if isinstance(self.min_group_size, bool) or not isinstance(self.min_group_size, int) or self.min_group_size < 1:
            raise ValueError(f"TraceTrainConfig.min_group_size must be an int >= 1, got {self.min_group_size!r}")
        if not isinstance(self.drop_equal_groups, bool):
            raise ValueError(f"TraceTrainConfig.drop_equal_groups must be a bool, got {self.drop_equal_groups!r}")


@dataclass(frozen=True, eq=False)
class StepBuild:
    """A step's learner input and what it was built from."""

    rows: TraceRows  # every row, before group filtering
    kept: tuple[int, ...]  # indices into rows.sequences that train
    batch: Any  # sqlrl.learn.batch.TokenBatch of the kept rows, or None when none is kept
    metrics: dict[str, Any]


@dataclass(frozen=True)
class _Parts:
    parts: dict[str, float]  # what ``solved`` reads of a reward breakdown


def _trained_groups(rows: TraceRows, cfg: TraceTrainConfig) -> tuple[set[str], set[str], set[str]]:
    """(drawn, signal, trained) group ids: every group, those with unequal rewards
    (``sqlrl.learn.groups.informative_rows``: the built-in GRPO loop's test), those that train."""
    from sqlrl.learn.groups import informative_rows

    grouped = [r for r in rows.rollouts if r.in_group]
    gids, scores = [r.group_id for r in grouped], [float(r.reward) for r in grouped]
    size = Counter(gids)
    drawn = {r.group_id for r in rows.rollouts}
    signal = {gids[i] for i in informative_rows(range(len(grouped)), scores, gids)}
    trained = {g for g, n in size.items() if n >= cfg.min_group_size and (g in signal or not cfg.drop_equal_groups)}
    return drawn, signal, trained


def trained_groups(traces: Sequence[RolloutTrace], cfg: TraceTrainConfig, loss: GRPOConfig) -> set[str]:
    """The group ids of ``traces`` that would train (``build_step``'s ``groups_trained``), without
    building a batch: the job's dynamic sampling counts these after each draw."""
    return _trained_groups(training_rows(list(traces), cfg.sequences, loss), cfg)[2]


def step_metrics(traces: Sequence[RolloutTrace], rows: TraceRows, kept: Sequence[int],
                 groups: tuple[set[str], set[str], set[str]]) -> dict[str, Any]:
    """The step's metrics line (see the module's guarantees)."""
    done = [t for t in traces if t.status == "completed"]
    parts: dict[str, list[float]] = {}
    for t in done:
        for k, v in t.reward_parts.items():
            parts.setdefault(k, []).append(float(v))
    calls = [c for t in traces for c in t.calls]
    mismatches: Counter[str] = Counter()
    for r in rows.rollouts:
        mismatches.update(r.mismatches)
    followers = sum(max(0, r.n_calls - 1) for r in rows.rollouts)  # calls that could have merged
    merged = sum(r.n_merged for r in rows.rollouts)
    drawn, signal, trained = groups
    kept_seqs = [rows.sequences[i] for i in kept]
    return {"rollouts": len(traces), "completed": len(done),
            "expired": sum(t.status == "expired" for t in traces),
            "failed": sum(t.status == "failed" for t in traces),
            "setup_failed": sum(t.setup_failed for t in traces),
            "reward_mean": mean(float(t.reward) for t in done),
            "pass_rate": mean(float(solved(_Parts(dict(t.reward_parts)))) for t in done),
            **{f"reward_{k}": mean(v) for k, v in sorted(parts.items())},
            "calls": len(calls), "calls_mean": mean(len(t.calls) for t in traces),
            "trained_calls": sum(r.n_trained_calls for r in rows.rollouts),
            "incomplete_calls": sum(t.n_incomplete for t in traces),
            "prompt_tokens_mean": mean(len(c.prompt_ids) for c in calls),
            "response_tokens_mean": mean(len(c.response_ids) for c in calls),
            "merged_share": merged / followers if followers else 1.0,
            "mismatches": sum(mismatches.values()),
            **{f"mismatch_{cause}": mismatches.get(cause, 0) for cause in MISMATCH_CAUSES},
            "length_splits": sum(r.length_splits for r in rows.rollouts),
            "too_long_calls": sum(r.too_long_calls for r in rows.rollouts),
            "untrained_sequences": sum(r.untrained_sequences for r in rows.rollouts),
            "groups_drawn": len(drawn), "groups_signal": len(signal), "groups_trained": len(trained),
            "sequences": len(rows.sequences), "trained_on": len(kept_seqs),
            "trained_tokens": sum(s.n_generated for s in kept_seqs)}


def build_step(traces: Sequence[RolloutTrace], cfg: TraceTrainConfig, loss: GRPOConfig, *, pad_id: int,
               max_length: int | None = None) -> StepBuild:
    """A step's traces -> rows, the kept rows' batch (or None) and the metrics. ``loss``: the
    ``GRPOConfig``; ``max_length`` defaults to ``cfg.sequences.max_length``."""
    traces = list(traces)
    rows = training_rows(traces, cfg.sequences, loss)
    groups = _trained_groups(rows, cfg)
    kept = tuple(i for i, g in enumerate(rows.group_ids) if g in groups[2])
    batch = None
    if kept:
        from sqlrl.learn.batch import rl_batch

        batch = rl_batch([rows.sequences[i] for i in kept], [rows.rewards[i] for i in kept],
                         [rows.group_ids[i] for i in kept], loss, pad_id=pad_id,
                         max_length=max_length if max_length is not None else cfg.sequences.max_length,
                         advantages=[rows.advantages[i] for i in kept])
    return StepBuild(rows=rows, kept=kept, batch=batch, metrics=step_metrics(traces, rows, kept, groups))
