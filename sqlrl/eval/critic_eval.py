"""Evaluating BIRD-CRITIC-format predictions: success rate (SR%) overall and by dialect.

Inputs: the instances (``CriticTask`` JSONL, which must carry ``sol_sql``/``test_cases``) and a
predictions JSONL with one record per instance: ``instance_id`` and ``pred_sqls`` (a list of
statements, BIRD-CRITIC's field; ``pred_sql``/``sql`` strings are accepted too). Databases come
from a catalog (``{db_id: {dialect: url}}``) or, for a file-based engine (``Dialect.file_based``:
SQLite), from ``db_root/<db_id>/<db_id>.sqlite``.

Guarantees: every instance gets a verdict — a missing prediction is a failure with reason
``missing-prediction``, a prediction for an unknown instance is reported (not scored); instances
whose reference fails (``sol-error``) are listed and excluded from the SR denominator; verdicts
come back in instance order whatever the parallelism; a malformed line raises ``TaskError`` with
its line number.

Test-suite accuracy (``suite_check``, ``sqlrl.suites.evaluation.CriticSuiteCheck``): its
``refuse(tasks)`` runs before anything (instances it cannot check are an error, not a silent pass)
and every instance's database is resolved before any prediction runs; then every solved instance
is checked on the distilled database variants of its reference (``suite_match``,
``suite_failed_on``; ``CriticReport.to_dict()["test_suite"]``: accuracy over the scored instances
and ``lucky``, the solved ones that fail the suite).
"""

from __future__ import annotations

import concurrent.futures
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from sqlrl.db.dialects.descriptor import dialect_of
from sqlrl.tasks.loaders.base import db_file
from sqlrl.tasks.types import CriticTask, TaskError

from .critic import CriticVerdict, SolCache, run_critic
from .spider import suite_summary


@dataclass(frozen=True)
class CriticItem:
    instance_id: str
    db_id: str
    dialect: str
    category: str
    difficulty: str | None
    solved: bool
    score: float
    excluded: bool
    reason: str
    suite_match: bool | None = None  # with a test suite: solved here and on every suite variant
    suite_failed_on: str | None = None  # the variant a solved instance missed (a lucky match)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class CriticSuiteHook(Protocol):
    """What ``evaluate_critic`` takes as ``suite_check`` (module doc)."""

    def refuse(self, tasks: Sequence[CriticTask]) -> None:
        """Raise ``ValueError`` naming the instances that cannot have a suite."""

    def __call__(self, items: Sequence[CriticItem], tasks: Sequence[CriticTask],
                 predictions: Mapping[str, list[str]], urls: Sequence[str]) -> list[CriticItem]:
        """``items`` with ``suite_match`` set."""


@dataclass(frozen=True)
class CriticReport:
    items: tuple[CriticItem, ...]
    unknown_predictions: tuple[str, ...] = ()
    by: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    @property
    def sr(self) -> float:
        kept = [i for i in self.items if not i.excluded]
        return 100.0 * sum(i.solved for i in kept) / len(kept) if kept else 0.0

    def to_dict(self) -> dict[str, Any]:
        kept = [i for i in self.items if not i.excluded]
        out = {"instances": len(self.items), "scored": len(kept),
               "excluded": [i.instance_id for i in self.items if i.excluded],
               "solved": sum(i.solved for i in kept), "sr": self.sr,
               "mean_test_pass": (sum(i.score for i in kept) / len(kept)) if kept else 0.0,
               "by": self.by, "unknown_predictions": list(self.unknown_predictions)}
        suite = suite_summary(kept, len(kept), lambda i: i.solved)
        if suite is not None:
            out["test_suite"] = suite
        return out


def read_predictions(path: str | Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"BIRD-CRITIC predictions not found: {p}")
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{p}:{n}: not JSON: {exc}") from None
        if not isinstance(record, dict) or "instance_id" not in record:
            raise TaskError(f"{p}:{n}: a prediction needs an 'instance_id'")
        sqls = record.get("pred_sqls", record.get("pred_sql", record.get("sql")))
        if isinstance(sqls, str):
            sqls = [sqls]
        if sqls is None:
            sqls = []
        if not isinstance(sqls, list) or not all(isinstance(s, str) for s in sqls):
            raise TaskError(f"{p}:{n}: 'pred_sqls' must be a list of strings")
        out[str(record["instance_id"])] = sqls
    return out


def resolve_url(task: CriticTask, catalog: Mapping[str, Mapping[str, str]] | None,
                db_root: str | Path | None) -> str:
    if catalog and task.db_id in catalog and task.dialect in catalog[task.db_id]:
        return catalog[task.db_id][task.dialect]
    if dialect_of(task.dialect).file_based and db_root is not None:
        path = db_file(task.db_id, [Path(db_root)], task.dialect)
        if path is not None:
            return dialect_of(task.dialect).file_url(path)
    raise FileNotFoundError(f"no database for {task.db_id!r} ({task.dialect}): give a catalog "
                            f"entry or a database file under db_root/{task.db_id}/")


def evaluate_critic(tasks: Sequence[CriticTask], predictions: Mapping[str, list[str]], *,
                    catalog: Mapping[str, Mapping[str, str]] | None = None,
                    db_root: str | Path | None = None, timeout_s: float = 30.0,
                    test_timeout_s: float = 60.0, workers: int = 4,
                    progress: Callable[[int, int], None] | None = None,
                    suite_check: CriticSuiteHook | None = None) -> CriticReport:
    ids = {t.instance_id for t in tasks}
    urls = None
    if suite_check is not None:  # refusals and missing databases before any work
        suite_check.refuse(tasks)
        urls = [resolve_url(t, catalog, db_root) for t in tasks]
    cache = SolCache(max(16, len(tasks)))

    def one(task: CriticTask) -> CriticItem:
        base = dict(instance_id=task.instance_id, db_id=task.db_id, dialect=task.dialect,
                    category=task.category, difficulty=task.difficulty)
        if task.instance_id not in predictions:
            return CriticItem(**base, solved=False, score=0.0, excluded=False,
                              reason="missing-prediction")
        verdict: CriticVerdict = run_critic(task, predictions[task.instance_id],
                                            resolve_url(task, catalog, db_root),
                                            timeout_s=timeout_s, test_timeout_s=test_timeout_s,
                                            sol_cache=cache)
        kinds = sorted({o.kind.value for o in verdict.outcomes})
        return CriticItem(**base, solved=verdict.solved, score=verdict.score,
                          excluded=verdict.sol_error is not None,
                          reason="solved" if verdict.solved else ",".join(kinds))

    items: list[CriticItem | None] = [None] * len(tasks)
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futures = {pool.submit(one, t): i for i, t in enumerate(tasks)}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            items[futures[future]] = future.result()
            if progress:
                progress(done, len(tasks))
    final = tuple(i for i in items if i is not None)
    if suite_check is not None and urls is not None:
        final = tuple(suite_check(final, tasks, predictions, urls))
    return CriticReport(final, tuple(sorted(set(predictions) - ids)), _breakdown(final))


def _breakdown(items: Sequence[CriticItem]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in ("dialect", "category", "difficulty"):
        groups: dict[str, list[CriticItem]] = defaultdict(list)
        for item in items:
            if not item.excluded:
                groups[str(getattr(item, key))].append(item)
        out[key] = {g: {"n": len(v), "solved": sum(i.solved for i in v),
                        "sr": 100.0 * sum(i.solved for i in v) / len(v)}
                    for g, v in sorted(groups.items())}
    return out
