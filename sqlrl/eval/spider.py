"""Spider execution accuracy (test-suite semantics) over sqlrl sessions, with a gold-result cache.

    report = evaluate_spider("dev_gold.sql", "pred.txt", "spider/database")
    report.ex, report.items[0].match, report.gold_errors

Inputs are the official evaluator's: gold lines ``SQL<TAB>db_id``, prediction lines one SQL each
(cut at the first TAB, ``value`` replaced by ``1``; see ``compare.spider_clean_pred``).

Guarantees:
- Verdicts are those of ``evaluation.py --etype exec`` (plug_value=False, keep_distinct=False):
  both queries prepared by ``compare.spider_prepare``, compared by ``compare.spider_ex``; like the
  test-suite evaluator, a prediction must match on every ``*.sqlite`` file of the database's folder.
- All SQL runs through ``sqlrl.db`` sessions with a per-statement timeout enforced by the
  database; no query ever sees another query's writes (see ``QueryRunner``).
- Each distinct (database file, prepared query) is executed once per call, golds and predictions
  alike, so N predictions sharing a gold cost one gold execution.
- Fail-closed: a prediction that errors, times out or returns more than the result cap scores 0
  (``pred_error`` says why). A gold that errors (missing database, error, timeout, cap) is flagged
  in ``gold_error``, excluded from the EX denominator and listed in ``SpiderReport.gold_errors``.
- Bad input files raise ``ValueError`` naming the file and line; nothing is silently dropped.

``QueryRunner`` (the cached, parallel executor) is also used by ``bird.py``.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from sqlrl.db import ErrorKind, Limits, PoolConfig, Session, SessionError, SessionPool
from sqlrl.db.statements import leading_keywords, split_statements

from .compare import spider_clean_pred, spider_ex, spider_order_matters, spider_prepare

Row = tuple[Any, ...]
# (verdicts, prepared (gold, pred) pairs, the runner) -> verdicts with suite_match set
SuiteCheckFn = Callable[[list[Any], Sequence[tuple[Any, ...]], Any], list[Any]]

#: Result caps for evaluation: far above any Spider/BIRD gold result, so a capped gold is reported
#: as an error and a capped prediction (more rows than any gold) scores 0 correctly.
EVAL_MAX_ROWS = 1_000_000
EVAL_MAX_BYTES = 256 * 1024 * 1024


def eval_limits(timeout_s: float) -> Limits:
    return Limits(timeout_s=timeout_s, max_rows=EVAL_MAX_ROWS, max_bytes=EVAL_MAX_BYTES)


def default_workers() -> int:
    """One thread: on 2 cores, 2 threads labelled Spider's 3,888 pairs slower than 1 (the session's
    timeout check is a Python callback every few thousand SQLite instructions, so the GIL is taken
    back constantly; bench/rewards.py measures it). Pass ``workers`` for long-running queries."""
    return 1


# -- the executor ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """The result of one query: ``rows`` when it ran, else ``error`` (a one-line reason)."""

    rows: tuple[Row, ...] | None = None
    error: str | None = None


class QueryRunner:
    """Runs (database URL, SQL) pairs through ``sqlrl.db`` sessions and remembers outcomes, so each
    distinct pair runs once. ``run_many`` runs what is not cached yet on ``workers`` threads, in
    database order. Thread-safe; close it (or use ``with``).

    Sessions: a query that cannot write -- on SQLite, one statement whose first keyword is SELECT
    (SQLite has no side-effecting functions; extensions are off) -- runs in a session the thread
    keeps for that database while consecutive queries use it; any other query (WITH, DML, DDL,
    several statements) and every query on a server engine gets a fresh session, closed after it.
    Either way no query can see another's writes."""

    def __init__(self, limits: Limits, workers: int | None = None,
                 check: Callable[[str], str | None] | None = None) -> None:
        self.limits = limits
        self.workers = workers or default_workers()
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        self._check = check  # optional pre-execution rule: returns a reason to refuse the SQL
        self._pool = SessionPool(PoolConfig(max_size=self.workers + 2, limits=limits,
                                            checkout_timeout_s=max(60.0, 4 * limits.timeout_s)))
        self._cache: dict[tuple[str, str], Outcome] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # .held: (url, Session) kept for read-only queries
        self._held: dict[int, Session] = {}  # every kept session, by thread id (closed at close())
        self.executed = 0  # queries actually run (cache misses)

    def run(self, url: str, sql: str) -> Outcome:
        key = (url, sql)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        outcome = self._execute(url, sql)
        with self._lock:
            self._cache.setdefault(key, outcome)
            self.executed += 1
        return outcome

    def run_many(self, keys: Iterable[tuple[str, str]],
                 progress: Callable[[int, int], None] | None = None) -> dict[tuple[str, str], Outcome]:
        todo = sorted(dict.fromkeys(keys), key=lambda k: k[0])  # database by database
        out: dict[tuple[str, str], Outcome] = {}

        threads: set[int] = set()

        def one(key: tuple[str, str]) -> Outcome:
            threads.add(threading.get_ident())
            return self.run(*key)

        executor = None
        if self.workers == 1 or len(todo) < 2:
            results: Iterable[Outcome] = map(one, todo)
        else:
            executor = ThreadPoolExecutor(self.workers, thread_name_prefix="sqlrl-eval")
            results = executor.map(one, todo)
        try:
            for done, (key, outcome) in enumerate(zip(todo, results), 1):
                out[key] = outcome
                if progress is not None:
                    progress(done, len(todo))
        finally:
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
                self._release_held(threads)  # the sessions the worker threads kept
        return out

    def _execute(self, url: str, sql: str) -> Outcome:
        if self._check is not None:
            reason = self._check(sql)
            if reason:
                return Outcome(error=reason)
        try:
            if _cannot_write(url, sql):
                result = self._kept_session(url).execute(sql)
                if result.error is not None and result.error.kind is ErrorKind.SESSION_LOST:
                    self._drop_kept()
            else:
                session = self._pool.session(url)
                try:
                    result = session.execute(sql)
                finally:
                    session.close()
        except SessionError as exc:
            return Outcome(error=f"cannot open the database: {exc}")
        if result.error is not None:
            return Outcome(error=str(result.error))
        if result.truncated:
            return Outcome(error=f"result larger than the evaluation cap ({self.limits.max_rows} "
                                 f"rows / {self.limits.max_bytes} bytes)")
        return Outcome(rows=result.rows)

    def _kept_session(self, url: str) -> Session:
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == url and not held[1].closed:
            return held[1]
        self._drop_kept()
        session = self._pool.session(url)
        self._local.held = (url, session)
        with self._lock:
            self._held[threading.get_ident()] = session
        return session

    def _drop_kept(self) -> None:
        held = getattr(self._local, "held", None)
        self._local.held = None
        if held is not None:
            with self._lock:
                self._held.pop(threading.get_ident(), None)
            held[1].close()

    def _release_held(self, threads: set[int] | None = None) -> None:
        with self._lock:
            ids = [t for t in self._held if threads is None or t in threads]
            sessions = [self._held.pop(t) for t in ids]
        for session in sessions:
            session.close()

    def close(self) -> None:
        self._release_held()
        self._pool.close()

    def __enter__(self) -> "QueryRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cannot_write(url: str, sql: str) -> bool:
    """True for SQL that cannot change a SQLite database: one statement starting with SELECT."""
    return (url.startswith("sqlite:") and leading_keywords(sql, 1) == ("SELECT",)
            and len(split_statements(sql)) == 1)


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """A progress callback printing ``label: done/total`` to stderr about every 10%."""
    def report(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            print(f"{label}: {done}/{total}", file=sys.stderr, flush=True)
    return report


# -- Spider ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpiderPair:
    db_id: str
    gold: str
    pred: str


@dataclass(frozen=True)
class SpiderVerdict:
    index: int
    db_id: str
    gold: str
    pred: str
    match: bool
    pred_error: str | None = None
    gold_error: str | None = None
    order_matters: bool = False
    suite_match: bool | None = None  # with a test suite: match here and on every suite variant
    suite_failed_on: str | None = None  # the variant an EX match missed (a lucky match)


@dataclass(frozen=True)
class SpiderReport:
    items: tuple[SpiderVerdict, ...]
    matched: int
    scored: int  # items whose gold ran (the EX denominator)
    gold_errors: tuple[int, ...]  # indices of items whose gold failed (excluded)
    queries_executed: int
    elapsed_s: float

    @property
    def ex(self) -> float:
        return self.matched / self.scored if self.scored else 0.0

    def suite_summary(self) -> dict[str, Any] | None:
        return suite_summary(self.items, self.scored)

    def to_dict(self) -> dict[str, Any]:
        out = {"ex": self.ex, "matched": self.matched, "scored": self.scored,
               "n": len(self.items), "gold_errors": list(self.gold_errors),
               "queries_executed": self.queries_executed, "elapsed_s": self.elapsed_s,
               "items": [asdict(v) for v in self.items]}
        suite = self.suite_summary()
        if suite is not None:
            out["test_suite"] = suite
        return out


def suite_summary(items: Sequence[Any], scored: int,
                  matched: Callable[[Any], bool] = lambda v: v.match) -> dict[str, Any] | None:
    """Test-suite accuracy beside EX over ``scored`` items (the EX denominator), None when no
    item's suite was checked (``suite_match`` None everywhere): ``matched`` items with
    ``suite_match`` true, and ``lucky``, those EX marks correct that fail the suite."""
    if not any(v.suite_match is not None for v in items):
        return None
    passed = sum(bool(v.suite_match) for v in items)
    return {"ts": passed / scored if scored else 0.0, "matched": passed,
            "lucky": sum(matched(v) and not v.suite_match for v in items)}


def _database_files(db_dir: Path, db_id: str) -> list[Path]:
    """The test-suite rule: ``<db_dir>/<db_id>/<db_id>.sqlite`` must exist, and every file of that
    folder whose name contains ``.sqlite`` is a database the prediction must match on."""
    main = db_dir / db_id / f"{db_id}.sqlite"
    if not main.is_file():
        raise FileNotFoundError(f"database {db_id!r} not found: {main} is not a file")
    return sorted(p for p in main.parent.iterdir() if ".sqlite" in p.name and p.is_file())


def label_pairs(pairs: Iterable[SpiderPair | Sequence[str]], db_dir: str | Path, *,
                timeout_s: float = 30.0, workers: int | None = None, progress: bool = False,
                clean_pred: bool = False, runner: QueryRunner | None = None,
                processes: int = 1, suite_check: SuiteCheckFn | None = None) -> list[SpiderVerdict]:
    """Label (db_id, gold, pred) pairs with Spider test-suite execution match.

    ``clean_pred`` applies ``spider_clean_pred`` (what ``evaluation.py`` does to a prediction
    line); pass False to execute predictions exactly as given. A ``runner`` may be passed to share
    its cache across calls (its limits then apply, not ``timeout_s``). ``processes > 1`` splits
    the pairs by database over that many child processes (see ``label_in_processes``).
    ``suite_check``: also check every EX match on its gold's distilled test suite, filling
    ``suite_match`` -- ``(verdicts, prepared, runner) -> verdicts``, picklable when ``processes > 1``
    (``sqlrl.suites.evaluation.SpiderSuiteCheck(suite_dir)``: passed in, since the suites are built
    from the data generator, a layer above this one)."""
    items = [p if isinstance(p, SpiderPair) else SpiderPair(*p) for p in pairs]
    db_dir = Path(db_dir)
    if processes > 1 and runner is None:
        return label_in_processes(items, db_dir, processes, timeout_s, clean_pred, suite_check)[0]
    own = runner is None
    runner = runner or QueryRunner(eval_limits(timeout_s), workers)
    try:
        return _label(items, db_dir, runner, progress, clean_pred, suite_check)
    finally:
        if own:
            runner.close()


def _label_bucket(args: tuple) -> tuple[list[SpiderVerdict], int]:
    items, db_dir, timeout_s, clean_pred, suite_check = args
    with QueryRunner(eval_limits(timeout_s), 1) as runner:
        return _label(items, db_dir, runner, False, clean_pred, suite_check), runner.executed


def label_in_processes(items: list[SpiderPair], db_dir: Path, processes: int, timeout_s: float,
                       clean_pred: bool, suite_check: SuiteCheckFn | None = None
                       ) -> tuple[list[SpiderVerdict], int]:
    """Label ``items`` in ``processes`` child processes, one database at a time (so each distinct
    query still runs once), largest databases first; verdicts in input order, plus the
    number of queries executed. SQLite work is CPU-bound and the per-statement timeout check is a
    Python callback, so threads cannot use a second core; processes can. Children are forked when
    this process runs a single thread (cheap, and safe then), else come from a forkserver."""
    import multiprocessing as mp
    import threading

    by_db: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_db.setdefault(it.db_id, []).append(i)
    # one job per database, largest first, handed to whichever process is free (dynamic balance)
    buckets = sorted(by_db.values(), key=len, reverse=True)
    ctx = mp.get_context("fork" if threading.active_count() == 1 else "forkserver")
    with ctx.Pool(min(processes, len(buckets)) or 1) as pool:
        parts = pool.map(_label_bucket, [([items[i] for i in b], db_dir, timeout_s, clean_pred,
                                          suite_check) for b in buckets], chunksize=1)
    out: list[SpiderVerdict | None] = [None] * len(items)
    for bucket, (verdicts, _) in zip(buckets, parts):
        for i, v in zip(bucket, verdicts):
            out[i] = replace(v, index=i)
    return out, sum(n for _, n in parts)  # type: ignore[return-value]


def _label(items: list[SpiderPair], db_dir: Path, runner: QueryRunner, progress: bool,
           clean_pred: bool = True, suite_check: SuiteCheckFn | None = None) -> list[SpiderVerdict]:
    files: dict[str, list[str] | str] = {}  # db_id -> URLs, or why the database is unusable
    for db_id in dict.fromkeys(i.db_id for i in items):
        try:
            files[db_id] = [f"sqlite:///{p.resolve()}" for p in _database_files(db_dir, db_id)]
        except OSError as exc:
            files[db_id] = str(exc)

    prepared: list[tuple[Any, ...]] = []  # per item: (urls | None, gold_sql | err, pred_sql | err)
    for it in items:
        urls = files[it.db_id]
        gold = _prepare(it.gold)
        pred = _prepare(spider_clean_pred(it.pred) if clean_pred else it.pred)
        prepared.append((urls, gold, pred))

    gold_keys = [(u, g[1]) for urls, g, _ in prepared if isinstance(urls, list) and g[0]
                 for u in urls]
    golds = runner.run_many(gold_keys, stderr_progress("spider gold") if progress else None)

    def gold_failure(urls: Any, gold: tuple[bool, str]) -> str | None:
        if not isinstance(urls, list):
            return urls
        if not gold[0]:
            return gold[1]
        for u in urls:
            err = golds[(u, gold[1])].error
            if err is not None:
                return f"{err} (on {u})" if len(urls) > 1 else err
        return None

    gold_errs = [gold_failure(urls, g) for urls, g, _ in prepared]
    pred_keys = [(u, p[1]) for (urls, _, p), ge in zip(prepared, gold_errs) if ge is None and p[0]
                 for u in urls]
    preds = runner.run_many(pred_keys, stderr_progress("spider pred") if progress else None)

    verdicts = []
    for index, (it, (urls, gold, pred), gerr) in enumerate(zip(items, prepared, gold_errs)):
        order = gold[0] and spider_order_matters(it.gold)
        match, perr = False, None
        if gerr is None:
            if not pred[0]:
                perr = pred[1]
            else:
                match = True
                for u in urls:
                    p = preds[(u, pred[1])]
                    if p.error is not None:
                        match, perr = False, p.error
                        break
                    if not spider_ex(p.rows, golds[(u, gold[1])].rows, order):
                        match = False
                        break
        verdicts.append(SpiderVerdict(index, it.db_id, it.gold, it.pred, match, perr, gerr,
                                      bool(order)))
    if suite_check is not None:
        verdicts = suite_check(verdicts, prepared, runner)
    return verdicts


def _prepare(sql: str) -> tuple[bool, str]:
    """(True, prepared SQL) or (False, why it cannot be prepared)."""
    if not isinstance(sql, str):
        return False, f"the query is not text ({type(sql).__name__})"
    try:
        return True, spider_prepare(sql)
    except Exception as exc:  # ValueError for empty text; sqlparse's own errors on hostile text
        return False, f"cannot prepare the query: {exc}"


# -- the official input files ---------------------------------------------------------------------

def read_spider_gold(path: str | Path) -> list[tuple[str, str]]:
    """(SQL, db_id) per non-blank line of a gold file (``SQL<TAB>db_id``)."""
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.strip().split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{path}:{lineno}: a gold line must be 'SQL<TAB>db_id', got "
                             f"{len(fields)} TAB-separated field(s): {line[:120]!r}")
        out.append((fields[0], fields[1].strip()))
    return out


def read_spider_pred(path: str | Path) -> list[str]:
    """One prediction per non-blank line, exactly as written (cleaning happens at labelling)."""
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def evaluate_spider(gold_path: str | Path, pred_path: str | Path, db_dir: str | Path, *,
                    timeout_s: float = 30.0, workers: int | None = None,
                    progress: bool = True, processes: int = 1,
                    suite_check: SuiteCheckFn | None = None) -> SpiderReport:
    """Spider execution accuracy of the predictions in ``pred_path`` against ``gold_path``
    (``processes > 1``: split by database over child processes, ``label_in_processes``;
    ``suite_check``: test-suite accuracy too, ``label_pairs``)."""
    t0 = time.perf_counter()
    gold = read_spider_gold(gold_path)
    pred = read_spider_pred(pred_path)
    if len(gold) != len(pred):
        raise ValueError(f"{pred_path} has {len(pred)} predictions but {gold_path} has "
                         f"{len(gold)} gold queries (non-blank lines must pair up)")
    if not Path(db_dir).is_dir():
        raise FileNotFoundError(f"Spider database folder not found: {db_dir}")
    pairs = [SpiderPair(db, g, p) for (g, db), p in zip(gold, pred)]
    if processes > 1:
        items, executed = label_in_processes(pairs, Path(db_dir), processes, timeout_s, True,
                                             suite_check)
        return summarize(items, executed, time.perf_counter() - t0)
    with QueryRunner(eval_limits(timeout_s), workers) as runner:
        items = _label(pairs, Path(db_dir), runner, progress, True, suite_check)
        executed = runner.executed
    return summarize(items, executed, time.perf_counter() - t0)


def summarize(items: Sequence[SpiderVerdict], executed: int, elapsed_s: float) -> SpiderReport:
    gold_errors = tuple(v.index for v in items if v.gold_error is not None)
    return SpiderReport(items=tuple(items), matched=sum(v.match for v in items),
                        scored=len(items) - len(gold_errors), gold_errors=gold_errors,
                        queries_executed=executed, elapsed_s=elapsed_s)
