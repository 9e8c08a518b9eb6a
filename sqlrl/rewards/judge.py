"""The Judge: executes predictions (and gold, once per task) and returns verdicts for rewards.

Rewards are pure functions of (task, extracted answer, verdict); the Judge is the only part that
touches a database. It runs everything through sessions from a ``SessionSource``
(``sqlrl.db.source``): ``LocalSessions`` (in-process ``open_session``) by default, or
``PoolSessions`` (leases on the DB pool's reward partition) inside reward actors.

Guarantees:
- **Gold runs once per task** (per database URL and limits): an LRU of gold results, single-flight
  per key, so a GRPO group of n rollouts of one task executes the gold query once, not n times.
  Gold results that failed are cached too (a broken gold stays broken) unless the failure was a
  lost session or a timeout (those are retried by the next call).
- **Fail-closed**: a prediction that errors, times out, or returns more rows than the cap
  (``Limits.max_rows``; a truncated result can never be proven equal) is a non-match. A gold that
  errors, times out or is truncated makes the verdict ``gold_error`` — the reward marks it
  excluded and scores 0: it is never rewarded.
- Sessions come from ``sessions`` for every query, BIRD-CRITIC test cases included.
- Predictions and gold each run on a fresh session (scratch state: a prediction cannot alter
  what the gold sees, nor the base database). Multi-statement predictions run in order and the
  last statement's result is compared (as ``execute_sql`` shows it).
- A verdict's ``read_only`` is the engine's attestation that the prediction only read
  (``QueryResult.read_only``; for BIRD-CRITIC, over every test case's run of it): True or False
  only as the database engine reports it, None where the engine gave no attestation. The judge's
  sessions always ask for it (``Limits.attest`` is turned on, whatever limits were given).
- Never raises for anything a model wrote; ``ValueError`` only for a task whose database is not in
  the catalog (a configuration error).
- **Test suites** (``suites``, a ``sqlrl.suites.test_suite.TestSuites``; None by default): a
  text-to-SQL prediction that matches on the original database is also run, each time on a fresh
  session with the judge's limits, on every variant of its gold's distilled suite;
  ``bird_suite`` / ``spider_suite`` say whether it matched on the original **and** every variant
  (a variant the gold fails on is dropped, never rewarding), ``suite_failed_on`` names the first
  variant it missed. Gold results on variants are cached like the original's; the prediction's
  variant sessions are opened in one ``open_many``. A lost session on a variant, or a gold that
  failed while its suite was distilled (a timeout), is the infrastructure's failure, not the
  model's: the verdict gets ``gold_error`` ("test suite unavailable: …") and the sample is
  excluded, neither rewarded nor punished. A task on a server database takes its variants from
  the catalog's SQLite copy of that database (loaded on the server as sealed bases); without one
  it raises ``ValueError`` (a configuration error).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from sqlrl.db import ErrorKind, Limits, QueryResult, SessionError
from sqlrl.db.source import LocalSessions, SessionRequest, SessionSource, open_one
from sqlrl.eval.compare import bird_ex, outer_order_by, spider_ex
from sqlrl.eval.critic import CriticVerdict, SolCache, run_critic
from sqlrl.eval.spider import Outcome
from sqlrl.suites.test_suite import GoldFailed, Suite, SuiteCheck, TestSuites
from sqlrl.synth.variants import sqlite_path
from sqlrl.tasks.types import CriticTask, Text2SQLTask


@dataclass(frozen=True)
class ExecVerdict:
    """A text-to-SQL prediction judged against its gold by execution."""

    executed: bool  # the prediction ran without error and was not truncated
    bird_match: bool  # BIRD EX: set equality
    spider_match: bool  # Spider test-suite EX: bag equality, order when the gold orders
    pred_error: str | None = None  # "<kind>: <message>" when it did not execute
    pred_error_kind: str | None = None  # ErrorKind value, "too-many-rows" or "no-sql"
    gold_error: str | None = None  # the gold failed: exclude this sample
    pred_rows: int = 0
    gold_rows: int = 0
    read_only: bool | None = None  # the engine attested the prediction only read (QueryResult)
    suite_checked: bool = False  # the judge has test suites: the two fields below are meaningful
    bird_suite: bool = False  # bird_match on the original and on every variant of the suite
    spider_suite: bool = False  # spider_match on the original and on every variant of the suite
    suite_failed_on: str | None = None  # the first variant a prediction matching the original missed


class Judge:
    """Executes and compares; holds the gold cache. Thread-safe."""

    def __init__(self, catalog: Mapping[str, Mapping[str, str]], *, limits: Limits | None = None,
                 sessions: SessionSource | None = None, gold_cache_size: int = 4096,
                 critic_test_timeout_s: float = 30.0, suites: TestSuites | None = None) -> None:
        self.catalog = {db: dict(urls) for db, urls in catalog.items()}
        self.limits = replace(limits or Limits(timeout_s=10.0, max_rows=10_000), attest=True)
        self.sessions = sessions if sessions is not None else LocalSessions()
        self.critic_test_timeout_s = critic_test_timeout_s
        self.suites = suites
        self._gold: OrderedDict[Any, QueryResult] = OrderedDict()
        self._inflight: dict[Any, threading.Lock] = {}
        self._lock = threading.Lock()
        self._gold_size = gold_cache_size
        self.sol_cache = SolCache(gold_cache_size)
        self.gold_executions = 0
        self.gold_hits = 0

    def url(self, db_id: str, dialect: str) -> str:
        urls = self.catalog.get(db_id)
        if not urls or dialect not in urls:
            raise ValueError(f"database {db_id!r} ({dialect}) is not in the judge's catalog")
        return urls[dialect]

    # -- text-to-SQL -----------------------------------------------------------------------------

    def text2sql(self, task: Text2SQLTask, sql: str | None) -> ExecVerdict:
        url = self.url(task.db_id, task.dialect)
        gold = self._gold_result(task, url)
        gold_error = _failure(gold)
        if sql is None or not sql.strip():
            return ExecVerdict(False, False, False, "no SQL to run", "no-sql", gold_error,
                               gold_rows=gold.row_count)
        pred = self._run(url, (), sql)
        pred_error = _failure(pred)
        if pred_error is not None:
            kind = "too-many-rows" if pred.ok else pred.error.kind.value
            return ExecVerdict(False, False, False, pred_error, kind, gold_error,
                               pred.row_count, gold.row_count)
        if gold_error is not None:
            return ExecVerdict(True, False, False, None, None, gold_error, pred.row_count,
                               gold.row_count, pred.read_only)
        order = outer_order_by(task.gold_sql, task.dialect)
        verdict = ExecVerdict(True, bird_ex(pred.rows, gold.rows),
                              spider_ex(pred.rows, gold.rows, order), None, None, None,
                              pred.row_count, gold.row_count, pred.read_only)
        return verdict if self.suites is None else self._on_suite(task, url, sql, verdict, order)

    def _on_suite(self, task: Text2SQLTask, url: str, sql: str, verdict: ExecVerdict,
                  order: bool) -> ExecVerdict:
        """``verdict`` with the test-suite fields (module doc)."""
        if not (verdict.bird_match or verdict.spider_match):
            return replace(verdict, suite_checked=True)
        try:
            suite = self.suite(task)
        except GoldFailed as exc:  # it ran a moment ago: a timeout or a lost session
            return replace(verdict, suite_checked=True, gold_error=f"test suite unavailable: {exc}")
        golds = [self._gold_at(u, task.gold_sql) for u in suite.variants]
        preds = self._run_many(suite.variants, sql)
        lost = [r.error for r in golds + preds
                if r.error is not None and r.error.kind is ErrorKind.SESSION_LOST]
        if lost:  # the reward infrastructure failed, not the model: neither rewarded nor punished
            return replace(verdict, suite_checked=True, gold_error=f"test suite unavailable: {lost[0]}")
        check = SuiteCheck(tuple((u, _outcome(g), _outcome(p))
                                 for u, g, p in zip(suite.variants, golds, preds)))
        bird, bird_miss = check.passes(bird_ex)
        spider, spider_miss = check.passes(lambda p, g: spider_ex(p, g, order))
        return replace(verdict, suite_checked=True, bird_suite=verdict.bird_match and bird,
                       spider_suite=verdict.spider_match and spider,
                       suite_failed_on=bird_miss or spider_miss)

    def suite(self, task: Text2SQLTask) -> Suite:
        """The distilled test suite of ``task``'s gold (built once: in memory and in the suites'
        folder); ``GoldFailed`` when the gold fails on the original, ``ValueError`` without
        ``suites`` or for a server task without a SQLite copy in the catalog. Scoring calls it for
        a prediction that matched; ``sqlrl.suites.prebuild`` calls it before training."""
        if self.suites is None:
            raise ValueError("this Judge has no test suites (Judge(..., suites=TestSuites(dir)))")
        url = self.url(task.db_id, task.dialect)
        source = self.catalog.get(task.db_id, {}).get("sqlite")  # a server base's SQLite origin
        return self.suites.suite(task.db_id, url, task.gold_sql, self._outcome, task.dialect,
                                 sqlite_path(source) if source else None)

    def _outcome(self, url: str, sql: str) -> Outcome:
        return _outcome(self._run(url, (), sql))

    # -- debugging (BIRD-CRITIC) -----------------------------------------------------------------

    def critic(self, task: CriticTask, sqls: Sequence[str] | str | None) -> CriticVerdict:
        url = self.url(task.db_id, task.dialect)
        if sqls is None:
            sqls = []
        elif isinstance(sqls, str):
            sqls = [sqls]
        return run_critic(task, list(sqls), url, timeout_s=self.limits.timeout_s,
                          test_timeout_s=self.critic_test_timeout_s, sol_cache=self.sol_cache,
                          sessions=self.sessions)

    # -- internals -------------------------------------------------------------------------------

    def _run_many(self, urls: Sequence[str], sql: str) -> list[QueryResult]:
        """``sql`` on a fresh session per URL, the sessions opened in one ``open_many`` (one
        lease round trip on the DB pool) and closed together."""
        if len(urls) < 2:
            return [self._run(u, (), sql) for u in urls]
        try:
            sessions = self.sessions.open_many([SessionRequest(u, limits=self.limits) for u in urls])
        except Exception as exc:  # SessionError, a lease refused: never the model's fault
            failure = QueryResult.failure(ErrorKind.SESSION_LOST, f"could not open sessions: {exc}")
            return [failure] * len(urls)
        try:
            return [s.execute(sql) for s in sessions]
        finally:
            self.sessions.close_many(sessions)

    def _run(self, url: str, preprocess: Sequence[str], sql: str) -> QueryResult:
        try:
            request = SessionRequest(url, preprocess_sql=tuple(preprocess), limits=self.limits)
            with open_one(self.sessions, request) as session:
                return session.execute(sql)
        except SessionError as exc:
            return QueryResult.failure(ErrorKind.SESSION_LOST, f"could not open a session: {exc}")
        except Exception as exc:  # a lease refused, a dead shard: never the model's fault
            return QueryResult.failure(ErrorKind.SESSION_LOST, f"{type(exc).__name__}: {exc}")

    def _gold_result(self, task: Text2SQLTask, url: str) -> QueryResult:
        return self._gold_at(url, task.gold_sql)

    def _gold_at(self, url: str, gold_sql: str) -> QueryResult:
        key = (url, gold_sql, self.limits)
        with self._lock:
            if key in self._gold:
                self._gold.move_to_end(key)
                self.gold_hits += 1
                return self._gold[key]
            gate = self._inflight.setdefault(key, threading.Lock())
        with gate:  # single flight: concurrent rollouts of one task wait for one execution
            with self._lock:
                if key in self._gold:
                    self.gold_hits += 1
                    return self._gold[key]
            result = self._run(url, (), gold_sql)
            with self._lock:
                self.gold_executions += 1
                self._inflight.pop(key, None)
                transient = (result.error is not None and result.error.kind in
                             (ErrorKind.SESSION_LOST, ErrorKind.TIMEOUT))
                if not transient:
                    self._gold[key] = result
                    while len(self._gold) > self._gold_size:
                        self._gold.popitem(last=False)
            return result

    def stats(self) -> dict[str, int]:
        return {"gold_executions": self.gold_executions, "gold_hits": self.gold_hits,
                "sol_hits": self.sol_cache.hits, "sol_misses": self.sol_cache.misses}


def _outcome(result: QueryResult) -> Outcome:
    failure = _failure(result)
    return Outcome(error=failure) if failure is not None else Outcome(rows=tuple(map(tuple, result.rows)))


def _failure(result: QueryResult) -> str | None:
    if result.error is not None:
        return str(result.error)
    if result.truncated:
        return f"result truncated at {result.row_count} rows (too many rows to compare)"
    return None
