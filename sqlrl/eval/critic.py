"""BIRD-CRITIC's test-case runner on sqlrl's executor: is a predicted fix correct?

    verdict = run_critic(task, ["SELECT ...;"], "sqlite:////data/shop.sqlite", sol_cache=cache)
    verdict.solved, verdict.score, verdict.outcomes, verdict.sol_error

Semantics (BIRD-CRITIC's ``evaluation/src``; differences are listed below):
- Each test case runs on a **fresh session** from the ``SessionSource`` (``sqlrl.db.source``;
  ``LocalSessions``: ``open_session(url, preprocess_sql=task.preprocess_sql)``)
  with ``Limits(timeout_s, max_rows=10_000, attest=True)`` (the engine says whether the prediction
  only read: ``TestCaseOutcome.read_only``); the predicted statements run first, in order, on it;
  then the test case; then ``task.clean_up_sql``. Errors in clean-up are recorded on the outcome,
  never fatal: sqlrl sessions are scratch (docs/sessions.md), so nothing any of these statements do
  reaches the base database and clean-up is run only for fidelity.
- An instance is solved when every test case passes. Empty ``test_cases`` means BIRD-CRITIC's
  default test case, run natively here: strip comments, query-level DISTINCT and ROUND from pred and
  sol (``critic_sql.strip_sql``), run pred's statements in order on its session and sol's in **its own**
  fresh session, take each side's last statement's rows, round floats to 2 places, and compare as
  sets (in order when ``conditions["order"]``); an empty result on either side never matches (as in
  BIRD-CRITIC's ``ex_base``). Because the sides run in separate sessions, a Management task (pred =
  ``UPDATE ...; SELECT ...``) is judged by the state its own statements left, compared with the state
  sol's statements left: what BIRD-CRITIC intends. (BIRD-CRITIC runs pred, then pred again and sol
  on the same connection, so a write-then-read pred sees its own writes twice.)
- Non-empty ``test_cases`` run in a child process (``sandbox.run_test_code``): hard timeout
  ``test_timeout_s``; the code's SQL runs on the test case's session, after the prediction ran, so
  tests can inspect the state the prediction left (how BIRD-CRITIC judges Management tasks).

Guarantees:
- **Fail-closed.** ``run_critic`` never raises for anything a prediction or a test does: an erroring
  prediction is ``pred-error``, one stopped by the DB-side timeout ``pred-timeout`` (each fails its
  test case); a test that fails its assert is ``failed``, raises or dies ``test-error``, runs past
  ``test_timeout_s`` ``test-timeout`` (killed). Once the prediction failed to execute, the remaining
  test cases get the same outcome without re-running it (as BIRD-CRITIC, which runs it once).
- **A broken reference is flagged, not scored.** When sol_sql errors, times out, returns no rows
  under the default test case (no prediction could pass), or preprocess_sql fails, the verdict has
  ``sol_error`` set and ``score == 0.0``; callers exclude such instances (``verdict.sol_error``).
- **Sol once per task.** The default test case's sol result is computed once per
  (instance, url, sol/preprocess text, limits) in a ``SolCache`` (thread-safe LRU, single-flight: 8
  concurrent rollouts of one task run sol once). Connection failures are not cached.
- Bad arguments (a non-string prediction, a non-positive timeout) raise ``ValueError`` at once.
"""

from __future__ import annotations

import enum
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlrl.db import ErrorKind, Limits, QueryResult, Session, SessionError
from sqlrl.db.types import read_only_of
from sqlrl.db.dialects.base import get_dialect
from sqlrl.db.source import LocalSessions, SessionRequest, SessionSource
from sqlrl.db.url import dialect_name, parse_url
from sqlrl.tasks.types import CriticTask

from .critic_sql import MAX_ROWS, results_match, strip_sql
from .sandbox import run_test_code

__all__ = ["CriticVerdict", "OutcomeKind", "SolCache", "TestCaseOutcome", "run_critic"]


class OutcomeKind(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"  # the prediction ran; the test case's check did not hold
    PRED_ERROR = "pred-error"  # a predicted statement failed (syntax, runtime, permission, ...)
    PRED_TIMEOUT = "pred-timeout"  # a predicted statement ran past timeout_s and was stopped
    SOL_ERROR = "sol-error"  # the reference (or preprocess_sql) failed: the instance is broken
    TEST_ERROR = "test-error"  # the test code raised, died, or its session could not be opened
    TEST_TIMEOUT = "test-timeout"  # the test code ran past test_timeout_s and was killed


@dataclass(frozen=True)
class TestCaseOutcome:
    __test__ = False  # not a pytest class

    index: int
    passed: bool
    kind: OutcomeKind
    message: str = ""
    cleanup_error: str | None = None  # clean_up_sql's failure, recorded and otherwise ignored
    read_only: bool | None = None  # the engine attested the prediction only read (QueryResult)


@dataclass(frozen=True)
class CriticVerdict:
    instance_id: str
    passed: int
    total: int
    outcomes: tuple[TestCaseOutcome, ...]
    sol_error: str | None = None

    @property
    def solved(self) -> bool:
        return self.sol_error is None and self.total > 0 and self.passed == self.total

    @property
    def score(self) -> float:
        """Fraction of test cases passed; 0.0 when the reference is broken (fail-closed)."""
        if self.sol_error is not None or self.total == 0:
            return 0.0
        return self.passed / self.total

    @property
    def read_only(self) -> bool | None:
        """Whether the engine attested that the prediction only read, on every test case's
        session (``QueryResult.read_only`` of each of its calls): False when it wrote on any,
        None when not attested on one (or there are no outcomes)."""
        return read_only_of(o.read_only for o in self.outcomes) if self.outcomes else None


@dataclass(frozen=True)
class _SolOutcome:
    rows: tuple[tuple[Any, ...], ...] = ()
    error: str | None = None
    cacheable: bool = True


class SolCache:
    """Thread-safe LRU of the default test case's sol results, single-flight per key."""

    def __init__(self, maxsize: int = 256) -> None:
        if maxsize < 1:
            raise ValueError(f"SolCache maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[Any, _SolOutcome] = OrderedDict()
        self._inflight: dict[Any, threading.Lock] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def _lookup(self, key: Any) -> _SolOutcome | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
            self.hits += 1
        return value

    def get_or_compute(self, key: Any, compute: Callable[[], _SolOutcome]) -> _SolOutcome:
        with self._lock:
            value = self._lookup(key)
            if value is not None:
                return value
            gate = self._inflight.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                value = self._lookup(key)
                if value is not None:
                    return value
                self.misses += 1
            try:
                value = compute()
                if value.cacheable:
                    with self._lock:
                        self._data[key] = value
                        while len(self._data) > self.maxsize:
                            self._data.popitem(last=False)
                return value
            finally:
                with self._lock:
                    self._inflight.pop(key, None)


def _check_sqls(name: str, sqls: Any) -> list[str]:
    if isinstance(sqls, str):
        sqls = [sqls]
    if not isinstance(sqls, Sequence) or not all(isinstance(s, str) for s in sqls):
        raise ValueError(f"{name} must be a string or a sequence of strings, got {sqls!r:.200}")
    return [s for s in sqls if s.strip()]


def _open(sessions: SessionSource, url: str, task: CriticTask, limits: Limits) -> Session:
    """A fresh session with the task's ``preprocess_sql`` run; raises ``SessionError``."""
    request = SessionRequest(url, preprocess_sql=tuple(task.preprocess_sql), limits=limits)
    return sessions.open_many([request])[0]


def _run_all(session: Session, sqls: Sequence[str]) -> tuple[QueryResult | None, bool | None]:
    """Run statements in order; stop at the first error; the last result (None if no SQL) and
    whether the engine attested that every statement only read (None when no SQL ran)."""
    result = None
    flags: list[bool | None] = []
    for sql in sqls:
        result = session.execute(sql)
        flags.append(result.read_only)
        if result.error is not None:
            break
    return result, (read_only_of(flags) if flags else None)


def _pred_failure(index: int, result: QueryResult) -> TestCaseOutcome:
    kind = OutcomeKind.PRED_TIMEOUT if result.error.kind is ErrorKind.TIMEOUT else OutcomeKind.PRED_ERROR
    return TestCaseOutcome(index, False, kind, f"prediction failed: {result.error}")


def _clean_up(session: Session, task: CriticTask) -> str | None:
    errors = []
    for sql in task.clean_up_sql:
        result = session.execute(sql)
        if result.error is not None:
            errors.append(f"{sql[:120]!r}: {result.error}")
    return "; ".join(errors) or None


def _sol_default(task: CriticTask, url: str, limits: Limits, dialect: str,
                 sessions: SessionSource) -> _SolOutcome:
    try:
        session = _open(sessions, url, task, limits)
    except SessionError as exc:
        text = str(exc)
        return _SolOutcome(error=f"cannot run sol_sql: {text}",
                           cacheable="preprocess_sql failed" in text)
    try:
        result, _ = _run_all(session, [strip_sql(s, dialect) for s in task.sol_sql])
        _clean_up(session, task)
    finally:
        sessions.close_many([session])
    if result is None:
        return _SolOutcome(error="sol_sql holds no statement")
    if result.error is not None:
        return _SolOutcome(error=f"sol_sql failed: {result.error}",
                           cacheable=result.error.kind is not ErrorKind.SESSION_LOST)
    if not result.rows:
        return _SolOutcome(error="sol_sql returned no rows: under the default test case no "
                                 "prediction can match (BIRD-CRITIC's ex_base fails empty results)")
    return _SolOutcome(rows=result.rows)


def _sol_key(task: CriticTask, url: str, limits: Limits) -> tuple[Any, ...]:
    digest = hashlib.sha256("\x00".join(
        ["sol", *task.sol_sql, "pre", *task.preprocess_sql]).encode()).hexdigest()
    return (task.instance_id, url, digest, limits.timeout_s, limits.max_rows)


def _default_test_case(task: CriticTask, preds: list[str], url: str, limits: Limits, dialect: str,
                       sol_cache: SolCache | None, sessions: SessionSource) -> TestCaseOutcome | str:
    """The default test case's outcome, or the sol error text."""
    def compute() -> _SolOutcome:
        return _sol_default(task, url, limits, dialect, sessions)

    sol = compute() if sol_cache is None else sol_cache.get_or_compute(
        _sol_key(task, url, limits), compute)
    if sol.error is not None:
        return sol.error
    if not preds:
        return TestCaseOutcome(0, False, OutcomeKind.PRED_ERROR, "the prediction holds no SQL")
    try:
        session = _open(sessions, url, task, limits)
    except SessionError as exc:
        return TestCaseOutcome(0, False, OutcomeKind.TEST_ERROR, f"cannot open a session: {exc}")
    try:
        result, read_only = _run_all(session, [strip_sql(s, dialect) for s in preds])
        cleanup = _clean_up(session, task)
    finally:
        sessions.close_many([session])
    if result.error is not None:
        out = _pred_failure(0, result)
        return TestCaseOutcome(0, False, out.kind, out.message, cleanup)
    if results_match(result.rows, sol.rows, task.order_matters):
        return TestCaseOutcome(0, True, OutcomeKind.PASSED, "", cleanup, read_only)
    how = "in order" if task.order_matters else "as sets"
    return TestCaseOutcome(0, False, OutcomeKind.FAILED,
                           f"results differ {how}: prediction gave {len(result.rows)} rows, "
                           f"sol_sql {len(sol.rows)}" + (" (empty prediction result)"
                                                         if not result.rows else ""), cleanup,
                           read_only)


_SANDBOX_KINDS = {"passed": OutcomeKind.PASSED, "failed": OutcomeKind.FAILED,
                  "error": OutcomeKind.TEST_ERROR, "timeout": OutcomeKind.TEST_TIMEOUT,
                  "sol-error": OutcomeKind.SOL_ERROR}


def _custom_test_case(index: int, code: str, task: CriticTask, preds: list[str], url: str,
                      limits: Limits, db_path: str, test_timeout_s: float, dialect: str,
                      sessions: SessionSource) -> TestCaseOutcome | QueryResult | str:
    """One custom test case: its outcome, the failing prediction result, or a sol error text."""
    try:
        session = _open(sessions, url, task, limits)
    except SessionError as exc:
        if "preprocess_sql failed" in str(exc):
            return f"cannot run the test cases: {exc}"
        return TestCaseOutcome(index, False, OutcomeKind.TEST_ERROR, f"cannot open a session: {exc}")
    try:
        result, read_only = _run_all(session, preds)
        if result is not None and result.error is not None:
            return result
        pred_rows = None if result is None or not result.columns else result.rows
        box = run_test_code(code, session.execute, pred_sqls=preds, sol_sqls=list(task.sol_sql),
                            db_path=db_path, conditions=dict(task.conditions),
                            pred_query_result=pred_rows, dialect=dialect,
                            timeout_s=test_timeout_s)
        cleanup = _clean_up(session, task)
    finally:
        sessions.close_many([session])
    kind = _SANDBOX_KINDS.get(box.status, OutcomeKind.TEST_ERROR)
    return TestCaseOutcome(index, kind is OutcomeKind.PASSED, kind, box.message, cleanup, read_only)


def run_critic(task: CriticTask, pred_sqls: Sequence[str], url: str, *, timeout_s: float = 10.0,
               test_timeout_s: float = 30.0, sol_cache: SolCache | None = None,
               sessions: SessionSource | None = None) -> CriticVerdict:
    """Judge ``pred_sqls`` (the predicted fix: statements run in order; a single string is one
    entry, blank entries are dropped) against ``task`` on the database at ``url``. ``timeout_s`` bounds each SQL statement (enforced by the database);
    ``test_timeout_s`` bounds each custom test case's code (the child is killed). ``sessions``
    gives each fresh session (``LocalSessions()`` when None; reward actors pass the pool's
    ``PoolSessions`` on the reward partition); a session it cannot open (``SessionError``) is a
    ``test-error`` outcome, or a ``sol_error`` when ``preprocess_sql`` failed."""
    if not isinstance(task, CriticTask):
        raise ValueError(f"task must be a CriticTask, got {type(task).__name__}")
    for name, value in (("timeout_s", timeout_s), ("test_timeout_s", test_timeout_s)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    preds = _check_sqls("pred_sqls", pred_sqls)
    sessions = sessions if sessions is not None else LocalSessions()
    limits = Limits(timeout_s=timeout_s, max_rows=MAX_ROWS, attest=True)  # read_only is asked
    parsed = parse_url(url)
    dialect = get_dialect(dialect_name(parsed)).sqlglot_dialect

    if not task.test_cases:
        out = _default_test_case(task, preds, url, limits, dialect, sol_cache, sessions)
        if isinstance(out, str):
            return CriticVerdict(task.instance_id, 0, 1,
                                 (TestCaseOutcome(0, False, OutcomeKind.SOL_ERROR, out),), out)
        return CriticVerdict(task.instance_id, int(out.passed), 1, (out,))

    outcomes: list[TestCaseOutcome] = []
    pred_failed: TestCaseOutcome | None = None
    sol_error: str | None = None
    db_path = str(parsed.database or "")
    for index, code in enumerate(task.test_cases):
        if sol_error is not None:
            outcomes.append(TestCaseOutcome(index, False, OutcomeKind.SOL_ERROR, sol_error))
            continue
        if pred_failed is not None:
            outcomes.append(TestCaseOutcome(index, False, pred_failed.kind,
                                            f"{pred_failed.message} (not re-run)"))
            continue
        if not preds:
            pred_failed = TestCaseOutcome(index, False, OutcomeKind.PRED_ERROR,
                                          "the prediction holds no SQL")
            outcomes.append(pred_failed)
            continue
        out = _custom_test_case(index, code, task, preds, url, limits, db_path, test_timeout_s,
                                dialect, sessions)
        if isinstance(out, str):
            sol_error = out
            outcomes.append(TestCaseOutcome(index, False, OutcomeKind.SOL_ERROR, out))
        elif isinstance(out, QueryResult):
            pred_failed = _pred_failure(index, out)
            outcomes.append(pred_failed)
        else:
            if out.kind is OutcomeKind.SOL_ERROR:
                sol_error = out.message
            outcomes.append(out)
    return CriticVerdict(task.instance_id, sum(o.passed for o in outcomes), len(outcomes),
                         tuple(outcomes), sol_error)
