"""How sure an evaluation is: success rates with a 95% interval, and the paired difference of two
evaluations of the same tasks with a bootstrap interval.

    wilson_interval(32, 64)                       # (0.3809..., 0.6190...)
    rate = success_rate([1, 0, 1, 1])             # Rate(successes=3, n=4, rate=0.75, ci95=(...))
    d = paired_difference({"t1": 0, "t2": 1}, {"t1": 1, "t2": 1})
    d.diff, d.ci95, d.only_before, d.only_after   # after - before, its interval, unmatched ids
    paired_difference({"t1": 0.25, "t2": 0.5}, {"t1": 0.75, "t2": 0.5}, fractional=True)
    mean_interval([0.25, 0.5, 1.0])               # bootstrap interval of a mean of per-task rates

Guarantees:
- ``wilson_interval(k, n)`` is the Wilson score interval for a binomial proportion,
  ``(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`` with ``p = k/n`` and ``z`` the two-sided
  normal quantile of ``level`` (1.95996... for 0.95), clipped to [0, 1]. It always contains ``k/n``,
  is never empty, and is ``(0, 1)`` for ``n == 0`` (nothing is known). ``k`` outside ``0..n`` is a
  ``ValueError``.
- Outcomes are per-task 0/1 values (bools, ints, or floats equal to 0 or 1); anything else is a
  ``ValueError`` naming the task. ``None`` marks a task that was not scored (excluded).
- ``paired_difference(before, after)`` matches the two evaluations by task id. Only tasks scored on
  both sides enter the difference (``n``); the tasks present on one side only (``only_before``,
  ``only_after``) and those present on both but unscored on one (``unscored``) are *reported* in
  the result, never silently dropped; ``strict=True`` turns any of them into a ``ValueError``.
  No task in common is a ``ValueError``.
- The interval is the percentile interval of ``resamples`` (default 10,000) paired bootstrap
  resamples of the matched tasks (tasks drawn with replacement, the pair kept together), drawn
  with ``numpy.random.default_rng(seed)``: the same inputs and seed give the same interval, bit for
  bit, independent of the order of the mappings. Resampling per-task differences in {-1, 0, 1}
  is done exactly as a multinomial draw over their three counts (the same distribution as drawing
  indices), so memory does not grow with the number of tasks. Identical outcomes give ``(0, 0)``.
- ``fractional=True``: the outcomes are per-task rates in [0, 1] (the share of a task's k sampled
  rollouts that solved it; anything else is a ``ValueError`` naming the task); the matching and
  reporting are the same, the resamples draw task indices (pairs kept together), ``gained`` /
  ``lost`` count the tasks whose rate rose / fell. Binary outcomes give the same ``diff``,
  ``gained`` and ``lost`` either way.
- ``mean_interval(values)`` is the percentile bootstrap interval (tasks drawn with replacement,
  same seed rule) of the mean of per-task rates in [0, 1]; it contains the mean; no values gives
  ``(0, 1)``.
- Pure Python + numpy; no Ray, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Iterable, Mapping

__all__ = ["Rate", "PairedDiff", "wilson_interval", "success_rate", "paired_difference", "as_outcome",
           "as_rate", "mean_interval"]


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (see the module doc)."""
    if isinstance(successes, bool) or isinstance(n, bool) or int(successes) != successes or int(n) != n:
        raise ValueError(f"successes and n must be integers, got {successes!r}, {n!r}")
    successes, n = int(successes), int(n)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    z = _z(level)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    # float rounding must not push the bound past the observed rate (exact at k = 0 and k = n)
    return (min(low, p), max(high, p))


def as_outcome(value: Any, task_id: str = "?") -> int | None:
    """A per-task outcome as 0 / 1, or None (unscored); anything else is a ValueError."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    raise ValueError(f"task {task_id!r}: an outcome must be 0, 1, a bool or None, got {value!r}")


def as_rate(value: Any, task_id: str = "?") -> float | None:
    """A per-task rate in [0, 1] (bools and ints count as 0 / 1), or None (unscored); anything
    else -- NaN, a string, a value outside [0, 1] -- is a ValueError."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)) and 0.0 <= float(value) <= 1.0:
        return float(value)
    raise ValueError(f"task {task_id!r}: a rate must be a number in [0, 1] or None, got {value!r}")


def mean_interval(values: Iterable[Any], *, resamples: int = 10_000, seed: int = 0,
                  level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of per-task rates (see the module doc)."""
    import numpy as np

    _check_resamples(resamples)
    _z(level)
    xs = np.array([r for i, v in enumerate(values) if (r := as_rate(v, str(i))) is not None], dtype=float)
    if not len(xs):
        return (0.0, 1.0)
    rng = np.random.default_rng(seed)
    means = xs[rng.integers(0, len(xs), size=(resamples, len(xs)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = (float(x) for x in np.quantile(means, [tail, 1.0 - tail]))
    m = float(xs.mean())
    return (min(low, m), max(high, m))


def _check_resamples(resamples: Any) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}")


@dataclass(frozen=True)
class Rate:
    """A success rate with its Wilson interval (``ci95`` at the level it was made with)."""

    successes: int
    n: int
    rate: float
    ci95: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return {"successes": self.successes, "n": self.n, "rate": self.rate, "ci95": list(self.ci95)}


def success_rate(outcomes: Iterable[Any], level: float = 0.95) -> Rate:
    """The rate of 1s among the scored outcomes (``None`` skipped), with its Wilson interval."""
    scored = [o for i, v in enumerate(outcomes) if (o := as_outcome(v, str(i))) is not None]
    k, n = sum(scored), len(scored)
    return Rate(k, n, k / n if n else 0.0, wilson_interval(k, n, level))


@dataclass(frozen=True)
class PairedDiff:
    """``after - before`` over the tasks scored in both evaluations, with its bootstrap interval."""

    n: int  # tasks scored on both sides
    before: float  # success rate of ``before`` on those tasks
    after: float
    diff: float  # after - before
    ci95: tuple[float, float]  # percentile bootstrap interval at ``level``
    gained: int  # tasks failed before, solved after
    lost: int  # tasks solved before, failed after
    only_before: tuple[str, ...] = ()  # task ids in ``before`` only
    only_after: tuple[str, ...] = ()
    unscored: tuple[str, ...] = ()  # in both, but None on at least one side
    resamples: int = 10_000
    seed: int = 0
    level: float = 0.95
    fractional: bool = False  # per-task rates (k sampled rollouts a task), not 0/1 outcomes

    @property
    def matched(self) -> bool:
        """True when both evaluations scored exactly the same tasks."""
        return not (self.only_before or self.only_after or self.unscored)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "before": self.before, "after": self.after, "diff": self.diff,
                "ci95": list(self.ci95), "gained": self.gained, "lost": self.lost,
                "only_before": list(self.only_before), "only_after": list(self.only_after),
                "unscored": list(self.unscored), "resamples": self.resamples, "seed": self.seed,
                "level": self.level, "fractional": self.fractional}


def paired_difference(before: Mapping[str, Any], after: Mapping[str, Any], *, resamples: int = 10_000,
                      seed: int = 0, level: float = 0.95, strict: bool = False,
                      fractional: bool = False) -> PairedDiff:
    """The paired bootstrap difference ``after - before`` (see the module doc); ``fractional``:
    per-task rates in [0, 1] instead of 0/1 outcomes."""
    import numpy as np

    _check_resamples(resamples)
    _z(level)  # checks the level
    convert = as_rate if fractional else as_outcome
    b = {str(k): convert(v, str(k)) for k, v in before.items()}
    a = {str(k): convert(v, str(k)) for k, v in after.items()}
    only_before = tuple(sorted(set(b) - set(a)))
    only_after = tuple(sorted(set(a) - set(b)))
    both = sorted(set(a) & set(b))
    unscored = tuple(t for t in both if a[t] is None or b[t] is None)
    if strict and (only_before or only_after or unscored):
        raise ValueError(f"the two evaluations are not of the same scored tasks: {len(only_before)} "
                         f"only before {list(only_before[:3])}, {len(only_after)} only after "
                         f"{list(only_after[:3])}, {len(unscored)} unscored on one side {list(unscored[:3])}")
    pairs = [(b[t], a[t]) for t in both if a[t] is not None and b[t] is not None]
    if not pairs:
        raise ValueError(f"no task is scored in both evaluations ({len(b)} before, {len(a)} after, "
                         f"{len(both)} ids in common)")
    n = len(pairs)
    gained = sum(1 for x, y in pairs if y > x)
    lost = sum(1 for x, y in pairs if y < x)
    rng = np.random.default_rng(seed)
    if fractional:
        d = np.array([y - x for x, y in pairs], dtype=float)
        diff = float(d.mean())
        means = d[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    else:
        diff = (gained - lost) / n
        # each resample: counts of (+1, -1, 0) differences among n tasks drawn with replacement
        counts = rng.multinomial(n, [gained / n, lost / n, (n - gained - lost) / n], size=resamples)
        means = (counts[:, 0] - counts[:, 1]) / n
    tail = (1.0 - level) / 2.0
    low, high = (float(x) for x in np.quantile(means, [tail, 1.0 - tail]))
    return PairedDiff(n=n, before=sum(x for x, _ in pairs) / n, after=sum(y for _, y in pairs) / n,
                      diff=diff, ci95=(low, high), gained=gained, lost=lost, only_before=only_before,
                      only_after=only_after, unscored=unscored, resamples=resamples, seed=seed, level=level,
                      fractional=fractional)
