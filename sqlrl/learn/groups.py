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
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Hashable, Sequence

__all__ = ["trainable_rows"]


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
