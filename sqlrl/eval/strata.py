"""A held-out evaluation set balanced across strata: the same tasks for every stage of a run.

    tasks = stratified_sample(pool, 64, seed=1, weights={"text2sql": 0.5, "critic": 0.5})

A stratum is ``(kind, difficulty, domain)``: the task kind (``task.kind``), its difficulty
(``task.difficulty``, ``"unknown"`` when it has none) and its domain (``domain_of(task)``: the
database, ``task.db_id``, by default; the generated data has one database per domain).

Guarantees:
- **Deterministic.** The same pool (in any order), ``n``, ``seed`` and ``weights`` (in any key
  order: ``{a: .5, b: .5}`` and ``{b: .5, a: .5}`` are one config) give the same tasks in the same
  order: kinds are handed out in name order, strata are ranked and tasks within a stratum shuffled
  with generators seeded by strings (``random.Random(str)`` is stable across processes and Python
  versions).
- **No task twice.** Task ids (``task.task_id``) must be unique in the pool (a duplicate is a
  ``ValueError`` naming it): a paired comparison matches evaluations by id.
- **Exact size when possible.** ``min(n, len(eligible pool))`` tasks, where the eligible pool is the
  kinds with a positive weight (``weights=None``: every kind in the pool, equal weights).
- **Kinds by weight.** Each kind gets ``n * w / sum(w)`` tasks, rounded by the largest-remainder
  method (ties to the alphabetically first kind); a kind with fewer
  tasks than its share gives all it has and the shortfall goes to the other kinds, by weight.
- **Strata balanced within a kind.** Tasks are handed out one at a time to the stratum of that kind
  with the fewest tasks so far (ties: the difficulty, then the domain, with the fewest so far in
  that kind, then in the whole set, then a seeded order), skipping exhausted strata. So the counts of any two strata of
  a kind that still had tasks left differ by at most 1. The per-difficulty and per-domain counts are
  spread greedily, not optimally: on a full grid (every difficulty x domain of a kind has tasks,
  as in the generated data) they differ by at most 1 within a kind and at most 2 over the set
  (tests/unit/test_eval_stats.py checks this over many sizes and seeds).
- The result is shuffled with the seed, so kinds and strata are interleaved.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

__all__ = ["Stratum", "stratum_of", "default_domain", "stratified_sample", "allocate_kinds", "strata_counts"]

Stratum = tuple[str, str, str]  # (kind, difficulty, domain)


def default_domain(task: Any) -> str:
    """The domain of a task: its database id."""
    return str(task.db_id)


def stratum_of(task: Any, domain_of: Callable[[Any], str] = default_domain) -> Stratum:
    return (str(task.kind), str(getattr(task, "difficulty", None) or "unknown"), str(domain_of(task)))


def strata_counts(tasks: Sequence[Any], domain_of: Callable[[Any], str] = default_domain) -> dict[Stratum, int]:
    """How many of ``tasks`` fall in each stratum (for reports and tests)."""
    return dict(Counter(stratum_of(t, domain_of) for t in tasks))


def _largest_remainder(weights: Mapping[str, float], size: int) -> dict[str, int]:
    total = sum(weights.values())
    exact = {k: size * w / total for k, w in weights.items()}
    counts = {k: math.floor(x) for k, x in exact.items()}
    left = size - sum(counts.values())
    for k in sorted(weights, key=lambda k: (-(exact[k] - counts[k]), k))[:left]:  # ties: first name
        counts[k] += 1
    return counts


def allocate_kinds(available: Mapping[str, int], n: int, weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """Tasks per kind: ``n`` split by ``weights`` (largest remainder), capped by what each kind has,
    the shortfall of a capped kind handed to the others by weight (see the module doc)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if weights is None:
        weights = {k: 1.0 for k in sorted(available)}
    for k, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"the weight of kind {k!r} must be a finite number >= 0, got {w!r}")
    live = {k: float(w) for k, w in weights.items() if w > 0}
    if not live:
        raise ValueError(f"no kind has a positive weight: {dict(weights)}")
    counts = {k: 0 for k in live}
    left = min(n, sum(available.get(k, 0) for k in live))
    while left > 0:
        open_ = {k: w for k, w in live.items() if counts[k] < available.get(k, 0)}
        share = _largest_remainder(open_, left)
        for k, c in share.items():
            c = min(c, available.get(k, 0) - counts[k])
            counts[k] += c
            left -= c
    return counts


def _rank(keys: Sequence[Any], seed: Any, what: str) -> dict[Any, int]:
    ordered = sorted(keys)
    random.Random(f"strata:{seed}:{what}").shuffle(ordered)
    return {k: i for i, k in enumerate(ordered)}


def stratified_sample(tasks: Sequence[Any], n: int, *, seed: int = 0,
                      weights: Mapping[str, float] | None = None,
                      domain_of: Callable[[Any], str] = default_domain) -> list[Any]:
    """``min(n, eligible)`` distinct tasks balanced across (kind, difficulty, domain) strata."""
    seen: set[str] = set()
    for t in tasks:
        if t.task_id in seen:
            raise ValueError(f"task id {t.task_id!r} appears twice in the pool: ids must be unique")
        seen.add(t.task_id)
    by_stratum: dict[Stratum, list[Any]] = {}
    for t in tasks:
        by_stratum.setdefault(stratum_of(t, domain_of), []).append(t)
    for s, items in by_stratum.items():
        items.sort(key=lambda t: t.task_id)
        random.Random(f"strata:{seed}:{'/'.join(s)}").shuffle(items)
    available = dict(Counter(s[0] for s in by_stratum for _ in by_stratum[s]))
    per_kind = allocate_kinds(available, n, weights)
    rank = _rank(list(by_stratum), seed, "strata")
    picked: list[Any] = []
    took: Counter = Counter()
    overall: Counter = Counter()  # ("difficulty" | "domain", value) -> tasks so far, over all kinds
    for kind, quota in sorted(per_kind.items()):
        strata = [s for s in by_stratum if s[0] == kind]
        mine: Counter = Counter()  # the same, within this kind
        for _ in range(quota):
            s = min((s for s in strata if took[s] < len(by_stratum[s])),
                    key=lambda s: (took[s], mine["difficulty", s[1]], mine["domain", s[2]],
                                   overall["difficulty", s[1]], overall["domain", s[2]], rank[s]))
            took[s] += 1
            for counter in (mine, overall):
                counter["difficulty", s[1]] += 1
                counter["domain", s[2]] += 1
        for s in strata:
            picked += by_stratum[s][:took[s]]
    picked.sort(key=lambda t: t.task_id)
    random.Random(f"strata:{seed}:order").shuffle(picked)
    return picked
