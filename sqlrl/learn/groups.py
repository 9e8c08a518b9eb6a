"""GRPO group filtering: which scored rollouts enter an update.

A GRPO step rolls out each task ``group_size`` times; the advantage of a row is its reward against
its group's. ``trainable_rows`` keeps the rows that can carry such a signal.

Guarantees:
- A row is kept only when it was scored (its reward breakdown is not ``excluded``: a broken
  reference or a reward-infrastructure failure is neither reward nor penalty), its rollout did not
  fail (``stop_reason != "error"``) and it generated at least one token.
- A row is kept only when at least two rows of its group (same group id) pass those checks: the
  advantage of a lone sample would be its raw reward (verl's group-of-one convention), not a
  comparison, so such groups are dropped whole.
- The result is the kept indices in input order; inputs are not changed. Pure Python, no torch.

``informative_rows(rows, scores, group_ids)`` narrows kept rows to the groups whose rewards differ
(max - min > ``tol``): GRPO's advantage is zero for a group of equal rewards, so such groups carry
no gradient and only dilute a token-mean loss (DAPO's dynamic sampling drops them and draws more).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Sequence

__all__ = ["informative_rows", "trainable_rows"]


def trainable_rows(trajectories: Sequence[Any], breakdowns: Sequence[Any],
                   group_ids: Sequence[Hashable]) -> list[int]:
    """Indices of the rows that enter the update (see the module's guarantees)."""
    if not len(trajectories) == len(breakdowns) == len(group_ids):
        raise ValueError(f"trajectories ({len(trajectories)}), breakdowns ({len(breakdowns)}) and group ids "
                         f"({len(group_ids)}) must have the same length")
    ok = [i for i, (tr, b) in enumerate(zip(trajectories, breakdowns))
          if not b.excluded and tr.stop_reason != "error" and tr.n_generated > 0]
    per_group = Counter(group_ids[i] for i in ok)
    return [i for i in ok if per_group[group_ids[i]] >= 2]


def informative_rows(rows: Sequence[int], scores: Sequence[float], group_ids: Sequence[Hashable],
                     tol: float = 1e-6) -> list[int]:
    """The indices of ``rows`` (e.g. ``trainable_rows``'s) whose group, among ``rows``, has rewards
    that differ by more than ``tol``; input order kept."""
    lo: dict[Hashable, float] = {}
    hi: dict[Hashable, float] = {}
    for i in rows:
        g, s = group_ids[i], float(scores[i])
        lo[g], hi[g] = min(lo.get(g, s), s), max(hi.get(g, s), s)
    return [i for i in rows if hi[group_ids[i]] - lo[group_ids[i]] > tol]
