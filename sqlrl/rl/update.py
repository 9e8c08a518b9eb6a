"""The policy update of a GRPO step (Ray-free): what the stage recipes and the gateway's agent job
both do with a step's kept rows, in one place.

- ``repeat_steps(learner, batch, loss, times)``: ``times`` (``updates_per_batch``, at least 1)
  ``learner.step(batch, "grpo", loss)`` calls on the same batch -- PPO's epochs over one rollout
  batch; the ratio and clipping see the policy move from the rollout's log-probs -- and the last
  call's metrics.
- ``policy_update(learner, loss, pad_id=..., max_length=..., times=...)``: the ``update`` callable of
  ``sqlrl.rl.grpo.GRPOFns`` for the built-in rollouts: tokens an older policy version generated are
  masked (``sqlrl.rl.staleness.mask_stale``, for ``weight_update: continue``), the batch is built
  with ``sqlrl.learn.batch.rl_batch`` (group-relative advantages; rows over ``max_length`` cut), then
  ``repeat_steps``; it returns the learner's metrics with the staleness counts.
The learner is anything with ``step(batch, algo, loss) -> metrics`` and ``version`` (``Learner``,
``LearnerGroup``): no torch here, no ray.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

__all__ = ["policy_update", "repeat_steps"]


def repeat_steps(learner: Any, batch: Any, loss: Any, times: int) -> dict[str, Any]:
    """``times`` GRPO learner steps on ``batch``; the last step's metrics (module docstring)."""
    if times < 1:
        raise ValueError(f"updates per batch must be at least 1, got {times}")
    metrics: Mapping[str, Any] = {}
    for _ in range(times):
        metrics = learner.step(batch, "grpo", loss)
    return dict(metrics)


def policy_update(learner: Any, loss: Any, *, pad_id: int, max_length: int | None,
                  times: int) -> Callable[[Sequence[Any], Sequence[float], Sequence[str]], dict[str, Any]]:
    """The ``GRPOFns.update`` of a stage's built-in rollouts on ``learner`` (module docstring)."""
    from sqlrl.learn.batch import rl_batch
    from sqlrl.rl.staleness import mask_stale

    def update(trajectories: Sequence[Any], scores: Sequence[float], group_ids: Sequence[str]) -> dict[str, Any]:
        kept = mask_stale(trajectories, learner.version)
        batch = rl_batch(kept.trajectories, list(scores), list(group_ids), loss, pad_id=pad_id, max_length=max_length)
        return {**repeat_steps(learner, batch, loss, times), **kept.metrics()}

    return update
