"""What a scored rollout means: the one definition of success, and the numbers built on it.

Guarantees:
- ``solved(breakdown)`` is the only definition of a solved task in sqlrl: the reward breakdown's
  ``result`` part is full marks (``>= 1``). The held-out evaluation (``jobs.held_out``), the probe
  and the GRPO step's pass rate all read it; ``outcome(breakdown)`` is 1 / 0, or None for an
  excluded row (a broken reference or a failed rollout: neither success nor failure).
- ``score_rollouts`` never scores a rollout that stopped on an infrastructure error (stop reason
  ``error``): its row is excluded (``sqlrl.rewards.registry.excluded``), neither reward nor penalty;
  the other rollouts are scored in one call, in order.
- ``rollout_metrics`` is over every scored row a step drew (excluded rows count nowhere), so the
  reward curve is the policy's whatever group filtering kept; ``trained_reward_mean`` is over the
  kept rows. Key order is fixed (it is a metrics.jsonl line).
- ``StageSignal`` sums up a stage's steps (SFT: loss first -> last; GRPO: pass rate first -> last
  and the groups with unequal rewards, the only ones with a gradient); ``to_dict()`` is the
  ``training`` entry of ``summary.json``.
Pure Python; inputs are not changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["StageSignal", "grpo_signal", "mean", "outcome", "rollout_metrics", "score_rollouts", "sft_signal",
           "solved"]


def mean(xs: Iterable[float]) -> float:
    """The mean of ``xs``; 0.0 for none."""
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def solved(breakdown: Any) -> bool:
    """True when a scored row's ``result`` part is full marks: the task solved."""
    return breakdown.parts.get("result", 0.0) >= 1.0


def outcome(breakdown: Any) -> int | None:
    """1 (solved), 0 (not), or None for an excluded row (not scored)."""
    return None if breakdown.excluded else int(solved(breakdown))


def score_rollouts(trajectories: Sequence[Any], tasks: Sequence[Any], reward: str,
                   score: Callable[[list[tuple[Any, Any]]], Sequence[Any]]) -> list[Any]:
    """A breakdown of reward ``reward`` per rollout, in order: ``score([(task, response), ...])``
    (one call) for the rollouts that ended, ``excluded`` for those that stopped on an error."""
    from ..rewards.registry import excluded

    out: list[Any] = [None] * len(tasks)
    asked, where = [], []
    for i, (traj, task) in enumerate(zip(trajectories, tasks, strict=True)):
        if traj.stop_reason == "error":  # the infrastructure failed, not the policy
            out[i] = excluded(reward, f"rollout-error: {traj.error}")
        else:
            asked.append((task, traj.response()))
            where.append(i)
    got = list(score(asked)) if asked else []
    if len(got) != len(asked):
        raise ValueError(f"score returned {len(got)} breakdowns for {len(asked)} rollouts")
    for i, b in zip(where, got):
        out[i] = b
    return out


def rollout_metrics(trajs: Sequence[Any], breakdowns: Sequence[Any], keep: Sequence[int]) -> dict[str, Any]:
    """One GRPO step's rollout and reward metrics (see the module's guarantees)."""
    scored = [b for b in breakdowns if not b.excluded]
    parts: dict[str, list[float]] = {}
    for b in scored:
        for k, v in b.parts.items():
            parts.setdefault(k, []).append(v)
    return {"reward_mean": mean(b.score for b in scored),
            "pass_rate": mean(float(solved(b)) for b in scored),
            **{f"reward_{k}": mean(v) for k, v in parts.items()},
            "trained_reward_mean": mean(breakdowns[i].score for i in keep),
            "trajectories": len(trajs), "trained_on": len(keep),
            "excluded": sum(b.excluded for b in breakdowns),
            "turns_mean": mean(len(t.turns) for t in trajs),
            "tool_calls_mean": mean(t.n_tool_calls for t in trajs),
            "tool_errors_mean": mean(t.n_tool_errors for t in trajs),
            "malformed_mean": mean(t.n_malformed for t in trajs),
            "response_tokens_mean": mean(t.n_generated for t in trajs)}


@dataclass(frozen=True)
class StageSignal:
    """What a stage's own training steps measured; ``text`` is the line the main job's table shows."""

    steps: int
    text: str
    loss_first: float | None = None
    loss_last: float | None = None
    pass_first: float | None = None
    pass_last: float | None = None
    groups_signal: int | None = None
    groups_drawn: int | None = None
    updates: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``training`` entry of ``summary.json`` (fields that were not measured left out)."""
        order = ("steps", "loss_first", "loss_last", "groups_signal", "groups_drawn", "updates", "pass_first",
                 "pass_last", "text")
        return {k: getattr(self, k) for k in order if getattr(self, k) is not None}


def _numbers(history: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [h[key] for h in history if isinstance(h.get(key), (int, float))]


def sft_signal(history: Sequence[Mapping[str, Any]]) -> StageSignal:
    """SFT: the loss of the first and the last step."""
    losses = _numbers(history, "loss")
    if not losses:
        return StageSignal(len(history), f"{len(history)} steps, no loss logged")
    return StageSignal(len(history), f"loss {losses[0]:.2f} -> {losses[-1]:.2f} over {len(history)} steps",
                       loss_first=losses[0], loss_last=losses[-1])


def grpo_signal(history: Sequence[Mapping[str, Any]]) -> StageSignal:
    """GRPO: the samples' pass rate first -> last, and how many groups drawn had unequal rewards
    (the only ones with a non-zero advantage), saying so when none had."""
    passes = _numbers(history, "pass_rate")
    drawn = sum(int(h.get("groups_drawn") or 0) for h in history)
    signal = sum(int(h.get("groups_signal") or 0) for h in history)
    rate = (f"samples' pass {passes[0]:.2f} -> {passes[-1]:.2f}" if len(passes) > 1
            else f"samples' pass {passes[0]:.2f}" if passes else "no rollouts")
    groups = (f"{signal} of {drawn} groups with unequal rewards" if signal
              else f"no group of {drawn} had unequal rewards: zero advantages, no gradient")
    n = len(history)
    return StageSignal(n, f"{rate}, {groups} over {n} step{'s' if n != 1 else ''}",
                       pass_first=passes[0] if passes else None, pass_last=passes[-1] if passes else None,
                       groups_signal=signal, groups_drawn=drawn,
                       updates=sum(1 for h in history if h.get("learner_step") is not None))
