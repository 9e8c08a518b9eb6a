"""Test-suite accuracy for the evaluate job (``python -m jobs.evaluate spider|bird|critic
--test-suite``): one check per benchmark, each the hook its evaluator in ``sqlrl.eval`` takes.

    check = BirdSuiteCheck(open_suite_dir("runs/eval/x/test_suite"))
    report = evaluate_bird(pred, gold, db_root, suite_check=check)   # report.to_dict()["test_suite"]

What every check guarantees (``suite_verdict``):
- Only an EX match is checked; anything else has ``suite_match = False``. A match passes the suite
  when the prediction also matches on every variant of its gold's distilled suite
  (``sqlrl.suites.test_suite``: variants fuzzed from the database's SQLite file by the
  schema/FK-respecting fuzzer, distilled per gold and cached under the suite folder). Distillation
  and the check use **the comparator the benchmark's EX uses on the original database**
  (``Comparison``), so a variant can only fail a prediction the way the original could have.
- A gold whose suite cannot be built (``ValueError``: no usable result on the original, a server
  database without a SQLite file) keeps its EX verdict and gets ``suite_failed_on = "no suite:
  <why>"`` (it passes: no variant caught it). Folder problems (``OSError``) are not hidden: they
  propagate; ``open_suite_dir`` checks the folder before any work.

Per benchmark:
- **Spider** (``SpiderSuiteCheck``): the gold and prediction as the test-suite evaluator prepares
  them (``compare.spider_prepare``), compared by ``spider_ex``, ordered exactly when EX orders
  (``spider_order_matters`` of the gold); the suite of the database's main file.
- **BIRD** (``BirdSuiteCheck``): the SQL as given, compared by ``bird_ex`` (``set(pred) ==
  set(gold)``, what ``evaluation_ex.py`` does), with the same runner and one-statement rule as EX.
- **BIRD-CRITIC** (``CriticSuiteCheck``): "the gold" is the reference solution ``sol_sql``. Only
  instances judged by the **default test case** have a suite: their program (``preprocess_sql``,
  then the statements with comments, DISTINCT and ROUND stripped, as the default test case runs
  them, in one fresh session) is compared by the last statement's rows with BIRD-CRITIC's
  ``results_match`` (rounded, as sets or in order by ``conditions.order``, at most 10,000 rows, an
  empty result never matches -- so a variant where the gold's result is empty is dropped); a
  program's neighbours are those of its last statement. Instances with custom ``test_cases`` are
  **refused** (``refuse``, before any work): their checks are Python written against the original
  database's contents (expected values, row counts, the state a fix must leave), which nothing can
  replay on a variant whose rows differ. Non-SQLite instances are refused too (the fuzzer makes
  variants of SQLite files; ``jobs.evaluate critic`` has no catalog of SQLite origins for servers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Mapping, Sequence

from sqlrl.eval.compare import bird_ex
from sqlrl.eval.critic_sql import MAX_ROWS, preprocess_results, results_match, strip_sql
from sqlrl.eval.spider import QueryRunner, eval_limits

from .neighbours import join_program
from .test_suite import Comparison, Run, TestSuites, check_suite, spider_ex_comparison

__all__ = ["BIRD_COMPARISON", "BirdSuiteCheck", "CriticSuiteCheck", "SpiderSuiteCheck",
           "critic_comparison", "critic_program", "open_suite_dir", "suite_verdict"]

BIRD_COMPARISON = Comparison("bird", bird_ex)


def open_suite_dir(path: str | Path) -> str:
    """``path`` made if missing and checked to be a folder this process can read and write;
    ``ValueError`` naming the problem otherwise."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"test-suite folder {folder} exists and is not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the test-suite folder {folder}: {exc}") from None
    if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
        raise ValueError(f"test-suite folder {folder} is not readable and writable by this process")
    return str(folder)


def suite_verdict(suites: TestSuites, db_id: str, url: str, gold_sql: str, pred_sql: str,
                  run: Run, compare: Comparison, dialect: str = "sqlite") -> tuple[bool, str | None]:
    """For an EX match: (True, None) when it passes its gold's suite, (False, the variant it
    missed), or (True, "no suite: <why>") when no suite can be built (module doc)."""
    try:
        suite = suites.suite(db_id, url, gold_sql, run, dialect, compare=compare)
    except ValueError as exc:
        return True, f"no suite: {exc}"
    return check_suite(suite, run, pred_sql).passes(compare.same, compare.usable)


# -- Spider ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpiderSuiteCheck:
    """``sqlrl.eval.spider``'s ``suite_check`` hook (picklable, so it travels to ``label_pairs``'
    child processes): ``(verdicts, prepared, runner) -> verdicts`` with ``suite_match`` set."""

    suite_dir: str

    def __call__(self, verdicts: Sequence[Any], prepared: Sequence[tuple[Any, ...]],
                 runner: Any) -> list[Any]:
        suites = TestSuites(self.suite_dir)
        out = []
        for v, (urls, gold, pred) in zip(verdicts, prepared):
            if not v.match:
                out.append(replace(v, suite_match=False))
                continue
            main = next((u for u in urls if u.endswith(f"/{v.db_id}.sqlite")), urls[0])
            ok, where = suite_verdict(suites, v.db_id, main, gold[1], pred[1], runner.run,
                                      spider_ex_comparison(v.order_matters))
            out.append(replace(v, suite_match=ok, suite_failed_on=where))
        return out


# -- BIRD ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BirdSuiteCheck:
    """``sqlrl.eval.bird``'s ``suite_check`` hook: ``(verdicts, urls, runner) -> verdicts`` with
    ``suite_match`` set; ``bird_ex`` on every variant, through EX's own runner."""

    suite_dir: str

    def refuse(self, urls: Sequence[str]) -> None:
        """Before any query: ``ValueError`` for databases that are not SQLite files (the fuzzer
        makes variants of SQLite files), ``FileNotFoundError`` naming the missing files."""
        from sqlrl.synth.variants import sqlite_path

        files = {u: sqlite_path(u) for u in dict.fromkeys(urls)}
        servers = [u for u, f in files.items() if f is None]
        if servers:
            raise ValueError(f"--test-suite refused: {len(servers)} databases are not SQLite files "
                             f"(test-suite variants are fuzzed from SQLite files; BIRD's server "
                             f"databases come with no SQLite origin here)")
        missing = sorted(str(f) for f in files.values() if f is not None and not f.is_file())
        if missing:
            raise FileNotFoundError(
                f"--test-suite: {len(missing)} database file(s) not found, so no variants can be "
                f"made of them: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")

    def __call__(self, verdicts: Sequence[Any], urls: Sequence[str], runner: Any) -> list[Any]:
        suites = TestSuites(self.suite_dir)
        out = []
        for v, url in zip(verdicts, urls):
            if not v.match:
                out.append(replace(v, suite_match=False))
                continue
            ok, where = suite_verdict(suites, v.db_id, url, v.gold, v.pred, runner.run,
                                      BIRD_COMPARISON)
            out.append(replace(v, suite_match=ok, suite_failed_on=where))
        return out


# -- BIRD-CRITIC -----------------------------------------------------------------------------------

def _critic_same(order: bool, pred: Sequence[tuple], gold: Sequence[tuple]) -> bool:
    return results_match(list(pred)[:MAX_ROWS], list(gold)[:MAX_ROWS], order)


def _critic_usable(gold: Sequence[tuple]) -> bool:
    return bool(preprocess_results(list(gold)[:MAX_ROWS]))


def critic_comparison(order: bool) -> Comparison:
    """The default test case's comparison (``critic_sql.results_match`` on at most ``MAX_ROWS``
    rows, as the runner caps them); a gold result that is empty after ``preprocess_results`` is
    not usable (no prediction can match it)."""
    return Comparison("critic-ordered" if order else "critic", partial(_critic_same, order),
                      _critic_usable)


def critic_program(task: Any, sqls: Sequence[str]) -> str:
    """One SQL text doing what the default test case does on a fresh session: the task's
    ``preprocess_sql``, then ``sqls`` with comments, DISTINCT and ROUND stripped."""
    from sqlrl.db.dialects.descriptor import dialect_of

    glot = dialect_of(task.dialect).sqlglot
    return join_program([*task.preprocess_sql, *(strip_sql(s, glot) for s in sqls if s.strip())])


@dataclass(frozen=True)
class CriticSuiteCheck:
    """``sqlrl.eval.critic_eval``'s ``suite_check`` hook: ``refuse(tasks)`` before any work, then
    ``(items, tasks, predictions, urls) -> items`` with ``suite_match`` set (module doc)."""

    suite_dir: str
    timeout_s: float = 30.0

    def refuse(self, tasks: Sequence[Any]) -> None:
        """``ValueError`` when any task cannot have a suite (module doc), naming them."""
        from sqlrl.db.dialects.descriptor import dialect_of

        custom = [t.instance_id for t in tasks if t.test_cases]
        servers = [t.instance_id for t in tasks if not dialect_of(t.dialect).file_based]
        problems = []
        if custom:
            problems.append(
                f"{len(custom)} of {len(tasks)} instances have custom test_cases (e.g. "
                f"{', '.join(custom[:3])}): their checks are Python code written against the "
                f"original database's contents, which cannot be replayed on database variants; "
                f"only instances judged by the default test case (no test_cases) have a test suite")
        if servers:
            problems.append(
                f"{len(servers)} instances are on a server dialect (e.g. {', '.join(servers[:3])}): "
                f"test-suite variants are fuzzed from SQLite files, so only SQLite instances have "
                f"a test suite here")
        if problems:
            raise ValueError("--test-suite refused: " + "; ".join(problems))

    def __call__(self, items: Sequence[Any], tasks: Sequence[Any],
                 predictions: Mapping[str, Sequence[str]], urls: Sequence[str | None]) -> list[Any]:
        self.refuse(tasks)
        suites = TestSuites(self.suite_dir)
        out = []
        with QueryRunner(eval_limits(self.timeout_s)) as runner:
            for item, task, url in zip(items, tasks, urls):
                if not item.solved or url is None:
                    out.append(replace(item, suite_match=False))
                    continue
                gold = critic_program(task, task.sol_sql)
                pred = critic_program(task, predictions[task.instance_id])
                ok, where = suite_verdict(suites, task.db_id, url, gold, pred, runner.run,
                                          critic_comparison(task.order_matters), task.dialect)
                out.append(replace(item, suite_match=ok, suite_failed_on=where))
        return out
