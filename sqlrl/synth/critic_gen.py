"""SQL-debugging tasks (BIRD-CRITIC format) made from text-to-SQL tasks by bug injection.

    critic_tasks, report = make_critic_tasks(text2sql_tasks, catalog, seed=0)
    critic_tasks, report = spider_critic_tasks("../shared/data/spider", split="dev")

For each text-to-SQL task, injectors from ``bugs.BUGS`` are tried in a seeded order (one category
after another, in a shuffled order; inside a category its injectors, shuffled), and an instance is
kept only when it is **verified by execution** with ``sqlrl.eval.critic.run_critic`` under the
default test case: the gold SQL (``sol_sql``) solves it and the buggy ``issue_sql`` does not.

Guarantees:
- Every returned ``CriticTask`` passed that check on the database in ``catalog``: ``run_critic(t,
  t.sol_sql, url).solved`` and ``not run_critic(t, t.issue_sql, url).solved`` (tests re-run it).
- ``query`` (the user's problem statement) restates the question and reports the symptom observed
  by actually running ``issue_sql`` (the error message, a wrong row count, a wrong value, a wrong
  order); it never states the fix. What was changed is kept in ``meta["bug_description"]`` for logs.
- ``bugs=None`` means every injector but ``NOT_BY_DEFAULT`` (the DISTINCT family, which the
  default test case cannot tell apart: it strips DISTINCT from both sides).
- At most one instance per bug category per source task, at most ``per_task`` per source task;
  instance ids are ``<task_id>/bug/<injector name>``; ``source`` is ``<task source>/critic``;
  difficulty is inherited; ``conditions["order"]`` is whether the gold has a top-level ORDER BY.
- Deterministic: the same tasks (in the same order), catalog contents, ``seed`` and arguments give
  the same instances (each task's random stream is seeded from ``seed`` and its task id; with
  ``balance=True``, the default, the order categories are tried in also depends on how many
  instances of each were kept before it).
- Nothing is dropped silently: every attempt lands in ``GenReport`` (kept, or rejected as
  ``not_applicable``, ``issue_passes``, ``sol_fails`` or ``error`` with the first messages kept).
  Bad arguments (``per_task < 1``, unknown bug names, a non-positive timeout) raise ``ValueError``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from sqlglot import exp

from sqlrl.db import Limits, QueryResult, SessionError, open_session
from sqlrl.tasks.types import CriticTask, Text2SQLTask

from .bugs import BUGS, Mutation, SchemaInfo, parse_sql, schema_from_url, sqlglot_dialect

__all__ = ["GenReport", "NOT_BY_DEFAULT", "REASONS", "compose_query", "make_critic_tasks",
           "spider_critic_tasks"]

NOT_APPLICABLE, ISSUE_PASSES, SOL_FAILS, ERROR = "not_applicable", "issue_passes", "sol_fails", "error"
REASONS = (NOT_APPLICABLE, ISSUE_PASSES, SOL_FAILS, ERROR)
# Left out when ``bugs`` is None: BIRD-CRITIC's default test case strips query-level DISTINCT from
# both sides before comparing, so these can never be verified (0 of 397 on Spider dev). They are
# still tried when named explicitly.
NOT_BY_DEFAULT = frozenset({"distinct_drop", "distinct_add"})
_MAX_MESSAGES = 20


@dataclass(frozen=True)
class GenReport:
    """What happened to every attempt. ``by_category[c]`` counts ``attempts``, ``kept`` and each
    rejection reason for bug category ``c``; ``sol_fails``/``error`` that concern a whole source
    task (gold fails its own test case, no database URL, unparsable gold) count once per task."""

    tasks: int = 0
    attempts: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    by_category: dict[str, dict[str, int]] = field(default_factory=dict)
    messages: tuple[str, ...] = ()  # the first error / sol-failure messages, "<task_id>: <text>"
    elapsed_s: float = 0.0

    @property
    def instances_per_s(self) -> float:
        return self.kept / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def kept_rate(self, category: str | None = None) -> float:
        """Kept / applicable attempts (overall, or for one category)."""
        c = self.by_category.get(category, {}) if category else {
            "attempts": self.attempts, "kept": self.kept,
            NOT_APPLICABLE: sum(v.get(NOT_APPLICABLE, 0) for v in self.by_category.values())}
        applicable = c.get("attempts", 0) - c.get(NOT_APPLICABLE, 0)
        return c.get("kept", 0) / applicable if applicable > 0 else 0.0

    def summary(self) -> str:
        lines = [f"{self.tasks} source tasks, {self.attempts} attempts, {self.kept} kept "
                 f"({self.instances_per_s:.1f} instances/s over {self.elapsed_s:.1f} s); rejected: "
                 + ", ".join(f"{r}={self.rejected.get(r, 0)}" for r in REASONS)]
        for cat in sorted(self.by_category):
            c = self.by_category[cat]
            lines.append(f"  {cat:24s} attempts={c.get('attempts', 0):5d} kept={c.get('kept', 0):5d} "
                         f"applicable-kept-rate={self.kept_rate(cat):.2f} "
                         + " ".join(f"{r}={c.get(r, 0)}" for r in REASONS if c.get(r)))
        return "\n".join(lines)


class _Tally:
    def __init__(self) -> None:
        self.tasks = self.attempts = self.kept = 0
        self.rejected: Counter[str] = Counter()
        self.by_category: dict[str, Counter[str]] = {}
        self.messages: list[str] = []

    def attempt(self, category: str, outcome: str) -> None:
        self.attempts += 1
        c = self.by_category.setdefault(category, Counter())
        c["attempts"] += 1
        c[outcome] += 1
        if outcome == "kept":
            self.kept += 1
        else:
            self.rejected[outcome] += 1

    def task_rejected(self, reason: str, task_id: str, message: str) -> None:
        self.rejected[reason] += 1
        self.note(task_id, message)

    def note(self, task_id: str, message: str) -> None:
        if len(self.messages) < _MAX_MESSAGES:
            self.messages.append(f"{task_id}: {message}")

    def report(self, elapsed_s: float) -> GenReport:
        return GenReport(self.tasks, self.attempts, self.kept, {r: self.rejected.get(r, 0) for r in REASONS},
                         {k: dict(v) for k, v in sorted(self.by_category.items())},
                         tuple(self.messages), elapsed_s)


# ----------------------------------------------------------------------------------------------
# The user's problem statement

_IMPERATIVE = {"list", "show", "find", "give", "return", "count", "get", "display", "compute",
               "calculate", "tell", "report", "sort", "order", "select", "identify", "provide",
               "retrieve", "name", "output", "fetch", "please"}

_OPENINGS = (
    "I'm trying to {intent}.",
    "I need a query to {intent}.",
    "I'm working with the {db} database and want to {intent}.",
    "I'm writing a query for this: \"{question}\"",
    "On the {db} database I have to answer: \"{question}\"",
)
_CLOSINGS = ("What am I doing wrong?", "How can I fix my query?", "Can someone help me fix it?",
             "Any idea what is wrong with it?", "")

_ERROR_TEMPLATES = (
    "My query fails with: {message}",
    "But when I run my query I get this error: {message}",
    "Running it gives me an error: {message}",
)
_TIMEOUT_TEMPLATES = (
    "My query runs for a very long time and then gets cancelled by the timeout.",
    "The query never finishes: it just times out.",
)


def _intent(question: str) -> str:
    q = " ".join(question.strip().split()).rstrip("?.! ")
    first = q.split(" ", 1)[0].lower() if q else ""
    if first in _IMPERATIVE:
        return q[0].lower() + q[1:]
    return "find out " + (q[0].lower() + q[1:] if q[:2] != q[:2].upper() else q)


def _rows(n: int) -> str:
    return "no rows" if n == 0 else "1 row" if n == 1 else f"{n} rows"


def _value(v: Any) -> str:
    text = repr(v) if isinstance(v, str) else "NULL" if v is None else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _result_symptom(issue: QueryResult, gold: QueryResult, mutation: Mutation,
                    rng: random.Random) -> str:
    """One or two sentences about how the (wrong but running) issue result looks."""
    n, m = issue.row_count, gold.row_count
    more = "more than " if issue.truncated else ""
    if len(issue.columns) != len(gold.columns) and issue.columns:
        return (f"It returns {len(issue.columns)} columns, but I expected {len(gold.columns)}. "
                f"{mutation.symptom}")
    if n == 0:
        return rng.choice(("It runs, but returns no rows at all, although there should be results.",
                           "The query runs without errors but the result is empty."))
    if n != m:
        return rng.choice((f"It runs, but it returns {more}{_rows(n)} and I expected {_rows(m)}.",
                           f"It returns {more}{_rows(n)}, while the correct answer has {_rows(m)}.",
                           f"I get {more}{_rows(n)} back instead of {_rows(m)}."))
    if n == 1 and len(issue.columns) == 1:
        return rng.choice((f"It returns {_value(issue.rows[0][0])}, which is not the right answer.",
                           f"I get {_value(issue.rows[0][0])}, and I'm sure that is wrong."))
    if sorted(map(repr, issue.rows)) == sorted(map(repr, gold.rows)):
        return rng.choice(("The rows are right, but they come back in the wrong order.",
                           "It returns the expected rows, but not in the order I need."))
    return rng.choice((f"It returns {_rows(n)}, but the values are not what I expect. "
                       f"{mutation.symptom}",
                       f"The query runs, but the result is wrong. {mutation.symptom}"))


def compose_query(question: str, db_id: str, issue: QueryResult, gold: QueryResult,
                  mutation: Mutation, rng: random.Random) -> str:
    """The user's issue: the question, the observed symptom of ``issue`` (never the fix)."""
    opening = rng.choice(_OPENINGS).format(intent=_intent(question), question=question.strip(),
                                           db=db_id)
    if issue.error is not None:
        if issue.error.kind.value == "timeout":
            symptom = rng.choice(_TIMEOUT_TEMPLATES)
        else:
            message = " ".join(issue.error.message.split())[:300]
            if message and message[-1] not in ".!?":
                message += "."
            symptom = rng.choice(_ERROR_TEMPLATES).format(message=message)
    else:
        symptom = _result_symptom(issue, gold, mutation, rng)
    return " ".join(p for p in (opening, symptom, rng.choice(_CLOSINGS)) if p)


# ----------------------------------------------------------------------------------------------
# Generation


def _order_matters(expr: exp.Expression) -> bool:
    return expr.args.get("order") is not None


def _same_rows(a: QueryResult, b: QueryResult) -> bool:
    return a.error is None and b.error is None and a.columns and len(a.columns) == len(b.columns) \
        and a.rows == b.rows and a.truncated == b.truncated


def _bag(r: QueryResult) -> Counter:
    return Counter(map(repr, r.rows))


def _plan(rng: random.Random, names: Sequence[str], kept: Counter | None = None) -> list[str]:
    """Injector names in the seeded trial order: categories shuffled (then, when ``kept`` is given,
    stably sorted so the categories with the fewest instances so far come first), then the
    injectors of each category, shuffled."""
    by_cat: dict[str, list[str]] = {}
    for n in names:
        by_cat.setdefault(BUGS[n].category, []).append(n)
    cats = sorted(by_cat)
    rng.shuffle(cats)
    if kept is not None:
        cats.sort(key=lambda c: kept[c])
    order = []
    for c in cats:
        group = sorted(by_cat[c])
        rng.shuffle(group)
        order.extend(group)
    return order


def _check_args(per_task: int, bugs: Iterable[str] | None, timeout_s: float) -> list[str]:
    if not isinstance(per_task, int) or per_task < 1:
        raise ValueError(f"per_task must be an integer >= 1, got {per_task!r}")
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    names = [n for n in BUGS if n not in NOT_BY_DEFAULT] if bugs is None else list(bugs)
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown bug injector(s) {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(BUGS)}")
    if not names:
        raise ValueError("bugs is empty: give at least one injector name")
    return names


def make_critic_tasks(tasks: Iterable[Text2SQLTask], catalog: dict[str, dict[str, str]], *,
                      seed: int = 0, per_task: int = 1, bugs: Iterable[str] | None = None,
                      timeout_s: float = 5.0, schemas: dict[str, SchemaInfo] | None = None,
                      balance: bool = True) -> tuple[list[CriticTask], GenReport]:
    """Verified debugging instances from ``tasks``; ``catalog`` is ``{db_id: {dialect: url}}``.
    ``schemas`` (``{db_id: SchemaInfo}``) skips introspecting the databases. ``balance`` tries
    first the categories that have the fewest kept instances so far (so the output is not
    dominated by the bugs that apply to nearly every query); the result then depends on the order
    of ``tasks`` too, still deterministically. With ``balance=False`` each task's instances
    depend only on the task and ``seed``."""
    from sqlrl.eval.critic import SolCache, run_critic

    names = _check_args(per_task, bugs, timeout_s)
    tally = _Tally()
    out: list[CriticTask] = []
    schema_cache: dict[str, SchemaInfo] = {}
    sol_cache = SolCache(maxsize=64)
    kept_by_category: Counter[str] = Counter()
    start = time.perf_counter()
    for task in tasks:
        if not isinstance(task, Text2SQLTask):
            raise ValueError(f"make_critic_tasks takes Text2SQLTask items, got {type(task).__name__}")
        tally.tasks += 1
        made = _one_task(task, catalog, names, seed, per_task, timeout_s, schemas or {},
                         schema_cache, sol_cache, run_critic, tally,
                         kept_by_category if balance else None)
        kept_by_category.update(t.meta["bug_category"] for t in made)
        out.extend(made)
    return out, tally.report(time.perf_counter() - start)


def _schema_for(task: Text2SQLTask, url: str, schemas: dict[str, SchemaInfo],
                cache: dict[str, SchemaInfo], timeout_s: float) -> SchemaInfo:
    given = schemas.get(task.db_id)
    if given is not None:
        return given if given.dialect == task.dialect else SchemaInfo(given.tables, task.dialect)
    if url not in cache:
        cache[url] = schema_from_url(url, timeout_s=timeout_s)
    return cache[url]


def _one_task(task: Text2SQLTask, catalog: dict[str, dict[str, str]], names: list[str], seed: int,
              per_task: int, timeout_s: float, schemas: dict[str, SchemaInfo],
              schema_cache: dict[str, SchemaInfo], sol_cache: Any, run_critic: Any,
              tally: _Tally, kept_by_category: Counter | None) -> list[CriticTask]:
    url = (catalog.get(task.db_id) or {}).get(task.dialect)
    if not url:
        tally.task_rejected(ERROR, task.task_id, f"no {task.dialect} URL for database "
                                                 f"{task.db_id!r} in the catalog")
        return []
    try:
        schema = _schema_for(task, url, schemas, schema_cache, timeout_s)
        expr = parse_sql(task.gold_sql, task.dialect)
    except (ValueError, RuntimeError, SessionError) as e:
        tally.task_rejected(ERROR, task.task_id, str(e))
        return []
    dialect = sqlglot_dialect(task.dialect)
    conditions = {"order": _order_matters(expr)}
    base = CriticTask(instance_id=f"{task.task_id}/bug", db_id=task.db_id, query=task.question,
                      issue_sql=(task.gold_sql,), sol_sql=(task.gold_sql,), dialect=task.dialect,
                      conditions=conditions, difficulty=task.difficulty)
    verdict = run_critic(base, base.sol_sql, url, timeout_s=timeout_s, sol_cache=sol_cache)
    if not verdict.solved:
        why = verdict.sol_error or "; ".join(o.message for o in verdict.outcomes)
        tally.task_rejected(SOL_FAILS, task.task_id, why)
        return []
    rng = random.Random(f"{seed}/{task.task_id}")
    kept: list[CriticTask] = []
    try:
        session = open_session(url, limits=Limits(timeout_s=timeout_s))
    except SessionError as e:
        tally.task_rejected(ERROR, task.task_id, str(e))
        return []
    with session:
        gold = session.execute(task.gold_sql)
        rendered = session.execute(expr.sql(dialect=dialect))
        if gold.error is not None or rendered.error is not None or \
                (gold.rows != rendered.rows and _bag(gold) != _bag(rendered)):
            tally.task_rejected(ERROR, task.task_id, "the gold SQL does not survive a sqlglot "
                                f"round trip unchanged ({rendered.error or 'different rows'})")
            return []
        done_categories: set[str] = set()
        for name in _plan(rng, names, kept_by_category):
            if len(kept) >= per_task:
                break
            injector = BUGS[name]
            if injector.category in done_categories:
                continue
            try:
                mutation = injector.inject(expr, schema, rng)
            except Exception as e:  # an injector bug on an odd query: count it, keep going
                tally.attempt(injector.category, ERROR)
                tally.note(task.task_id, f"injector {name} raised {type(e).__name__}: {e}")
                continue
            if mutation is None:
                tally.attempt(injector.category, NOT_APPLICABLE)
                continue
            issue = session.execute(mutation.issue_sql)
            if _same_rows(issue, gold):
                tally.attempt(injector.category, ISSUE_PASSES)
                continue
            candidate = CriticTask(
                instance_id=f"{task.task_id}/bug/{name}", db_id=task.db_id,
                query=compose_query(task.question, task.db_id, issue, gold, mutation, rng),
                issue_sql=(mutation.issue_sql,), sol_sql=(task.gold_sql,), dialect=task.dialect,
                conditions=dict(conditions), difficulty=task.difficulty,
                source=(task.source or "text2sql") + "/critic",
                meta={"origin_task_id": task.task_id, "bug": name, "bug_category": mutation.category,
                      "bug_description": mutation.description})
            # same sol/preprocess as ``base``: judged under its id so the sol result is cached
            check = CriticTask(instance_id=base.instance_id, db_id=task.db_id, query=candidate.query,
                               issue_sql=candidate.issue_sql, sol_sql=candidate.sol_sql,
                               dialect=task.dialect, conditions=dict(conditions))
            verdict = run_critic(check, check.issue_sql, url, timeout_s=timeout_s, sol_cache=sol_cache)
            if verdict.sol_error is not None:
                tally.attempt(injector.category, SOL_FAILS)
                continue
            if verdict.solved:
                tally.attempt(injector.category, ISSUE_PASSES)
                continue
            tally.attempt(injector.category, "kept")
            done_categories.add(injector.category)
            kept.append(candidate)
    return kept


def spider_critic_tasks(spider_root: str | Path, split: str = "dev", *, seed: int = 0,
                        per_task: int = 1, bugs: Iterable[str] | None = None, timeout_s: float = 5.0,
                        db_ids: Iterable[str] | None = None, limit: int | None = None
                        ) -> tuple[list[CriticTask], GenReport]:
    """Debugging instances from Spider's gold SQL on the real Spider databases (SQLite).
    ``db_ids`` restricts to some databases; ``limit`` to the first N remaining tasks."""
    from sqlrl.tasks.loaders.spider import load_spider

    taskset = load_spider(spider_root, split)
    wanted = set(db_ids) if db_ids is not None else None
    tasks = [t for t in taskset.tasks if wanted is None or t.db_id in wanted]
    if limit is not None:
        tasks = tasks[:limit]
    return make_critic_tasks(tasks, taskset.catalog, seed=seed, per_task=per_task, bugs=bugs,
                             timeout_s=timeout_s)
