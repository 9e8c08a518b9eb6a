"""Self-consistency (SQL-R1, §2.4): pick one SQL among k sampled candidates by executing them and
voting over their results.

Rule (documented, tested):
1. Candidates that fail (error, timeout, truncated result, no SQL) get no vote.
2. The others are grouped by their result: rows compared as a multiset (as a sequence when the
   candidate's outermost query has ORDER BY), values canonicalised (``compare.canonical_value``:
   ``5`` and ``5.0`` agree).
3. The largest group wins. **Tie-break**: the group whose best member has the highest mean token
   log-probability (when log-probs are given), then the group that appeared first in sampling
   order. Within the winning group, the earliest candidate is returned.
4. If every candidate failed, the first candidate with any SQL is returned (so a prediction file
   always has a line), flagged ``unanimous_failure``.

Pure: execution happens in the caller (``execute``), so tests pass canned results.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlrl.db.types import QueryResult

from .compare import canonical_rows, outer_order_by


@dataclass(frozen=True)
class Vote:
    sql: str | None
    index: int | None  # which candidate
    votes: int  # size of the winning group
    groups: int  # distinct results among the candidates that ran
    failed: int  # candidates that did not run
    unanimous_failure: bool = False


def result_key(result: QueryResult, ordered: bool) -> Any:
    rows = canonical_rows(result.rows)
    return ("seq", tuple(rows)) if ordered else ("bag", frozenset(Counter(rows).items()))


def vote(candidates: Sequence[str | None], execute: Callable[[str], QueryResult], *,
         logprobs: Sequence[float | None] | None = None) -> Vote:
    """``execute(sql)`` runs one candidate on a fresh session and never raises (sqlrl sessions)."""
    groups: dict[Any, list[int]] = {}
    failed = 0
    for i, sql in enumerate(candidates):
        if not sql or not sql.strip():
            failed += 1
            continue
        result = execute(sql)
        if result.error is not None or result.truncated:
            failed += 1
            continue
        groups.setdefault(result_key(result, outer_order_by(sql)), []).append(i)
    if not groups:
        first = next((i for i, s in enumerate(candidates) if s and s.strip()), None)
        return Vote(None if first is None else candidates[first], first, 0, 0, failed, True)

    def mean_lp(i: int) -> float:
        if logprobs is None or logprobs[i] is None:
            return float("-inf")
        return float(logprobs[i])  # type: ignore[arg-type]

    best = max(groups.values(), key=lambda members: (len(members), max(mean_lp(i) for i in members),
                                                     -members[0]))
    return Vote(candidates[best[0]], best[0], len(best), len(groups), failed)
