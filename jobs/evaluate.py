"""The evaluate job: score predictions with the official semantics of Spider, BIRD or BIRD-CRITIC.

    python -m jobs.evaluate spider --gold dev_gold.sql --pred pred.sql --db spider/database \\
                                   [--etype exec] [--questions spider/dev.json] [--test-suite]
    python -m jobs.evaluate bird   --pred predict_dev.json --gold mini_dev_sqlite_gold.sql \\
                                   --db-root dev_databases [--questions mini_dev_sqlite.json] \\
                                   [--test-suite]
    python -m jobs.evaluate critic --tasks instances.jsonl --pred preds.jsonl \\
                                   [--db-root DIR] [--catalog catalog.json] [--test-suite]
    # on a cluster: ray job submit --working-dir . -- python -m jobs.evaluate spider ...

Inputs are the official evaluators' (Spider ``evaluation.py --etype exec``: gold lines
``SQL<TAB>db_id``, one predicted SQL per line, the database folder; BIRD: the predicted-SQL JSON,
the gold SQL file, the database root; BIRD-CRITIC: predictions JSONL with ``pred_sqls``).
Writes to ``--out`` (default ``runs/eval/<kind>-<time>``): ``verdicts.jsonl`` (one line per item),
``report.json`` and ``report.md`` (EX overall and by difficulty; SR% by dialect for BIRD-CRITIC;
with ``--test-suite``, test-suite accuracy beside EX / SR and the count of EX matches (solved
instances) that fail the suite: ``sqlrl.suites.evaluation``, one check per benchmark, each with
its benchmark's own comparator; BIRD-CRITIC instances with custom test cases and databases that
are not SQLite files are refused, exit 2),
and prints the table (plain markdown when stdout is not a terminal). Every path option is checked
before anything runs; all missing ones are named at once (``--gold: /x does not exist``, exit 2).
Reads top to bottom: parse → check paths → evaluate → write → print.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rich.table import Table

from jobs.console import Heartbeat, check_paths, make_console
from sqlrl.db.dialects.descriptor import dialect_of, dialects

console = make_console(stderr=True)


# -- evaluators (their registry, EVALUATORS, follows the report tables) ---------------------------

def _spider_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gold", required=True, help="gold file: SQL<TAB>db_id per line")
    p.add_argument("--pred", required=True, help="predictions: one SQL per line")
    p.add_argument("--db", required=True, help="database folder (<db_id>/<db_id>.sqlite)")
    p.add_argument("--etype", default="exec", choices=["exec"],
                   help="only execution accuracy (the test-suite 'exec' metric) is implemented")
    p.add_argument("--questions", help="dev.json (its parsed 'sql' gives Spider hardness levels)")
    p.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1),
                   help="child processes, each labelling whole databases (1: in this process)")
    _suite_args(p)


def _suite_args(p: argparse.ArgumentParser) -> None:
    """``--test-suite`` and ``--suite-dir``, the same for every kind."""
    p.add_argument("--test-suite", action="store_true",
                   help="also report test-suite accuracy: every EX match checked on database "
                        "variants distilled per gold (sqlrl.suites.evaluation)")
    p.add_argument("--suite-dir", help="where variants and suites are cached "
                                       "(default <out>/test_suite; reuse it across runs)")


def _suite_dir(a: argparse.Namespace) -> str | None:
    """The checked suite folder with ``--test-suite`` (``ValueError`` when unusable), else None."""
    from sqlrl.suites.evaluation import open_suite_dir

    if not a.test_suite:
        return None
    return open_suite_dir(a.suite_dir or Path(a.out) / "test_suite")


def _spider_paths(a: argparse.Namespace) -> list[tuple[str, str | None, str]]:
    return [("--gold", a.gold, "file"), ("--pred", a.pred, "file"), ("--db", a.db, "dir"),
            ("--questions", a.questions, "file")]


def _spider_run(a: argparse.Namespace) -> tuple[list[dict], dict]:
    from sqlrl.eval.spider import evaluate_spider
    from sqlrl.suites.evaluation import SpiderSuiteCheck

    suite_dir = _suite_dir(a)
    report = evaluate_spider(a.gold, a.pred, a.db, timeout_s=a.timeout, workers=a.workers,
                             progress=a.processes <= 1, processes=a.processes,
                             suite_check=SpiderSuiteCheck(suite_dir) if suite_dir else None)
    rows = [asdict(v) for v in report.items]
    summary = {k: v for k, v in report.to_dict().items() if k != "items"}
    if a.questions:
        from sqlrl.tasks.loaders.spider import spider_hardness

        questions = json.loads(Path(a.questions).read_text(encoding="utf-8"))
        if len(questions) != len(rows):
            raise SystemExit(f"--questions has {len(questions)} items, the gold file {len(rows)}")
        for row, q in zip(rows, questions):
            row["hardness"] = spider_hardness(q["sql"])
        summary["by_hardness"] = _by(rows, "hardness", excluded=lambda r: r["gold_error"] is not None)
    return rows, summary


def _bird_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pred", required=True, help="predicted SQL JSON ({\"0\": \"SQL\\t----- bird -----\\tdb\"})")
    p.add_argument("--gold", required=True, help="gold SQL file: SQL<TAB>db_id per line")
    p.add_argument("--db-root", required=True, help="database root (<db_id>/<db_id>.sqlite) "
                                                    "or an admin URL for server dialects")
    p.add_argument("--dialect", default="sqlite",  # the engines BIRD evaluation supports
                   choices=[d.name for d in dialects() if d.verified])
    p.add_argument("--questions", help="the questions JSON (gives difficulty)")
    _suite_args(p)


def _bird_paths(a: argparse.Namespace) -> list[tuple[str, str | None, str]]:
    file_based = dialect_of(a.dialect).file_based  # else --db-root may be a server's admin URL
    db_root = a.db_root if file_based or "://" not in a.db_root else None
    return [("--pred", a.pred, "file"), ("--gold", a.gold, "file"), ("--db-root", db_root, "dir"),
            ("--questions", a.questions, "file")]


def _bird_run(a: argparse.Namespace) -> tuple[list[dict], dict]:
    from sqlrl.eval.bird import evaluate_bird
    from sqlrl.suites.evaluation import BirdSuiteCheck

    suite_dir = _suite_dir(a)
    report = evaluate_bird(a.pred, a.gold, a.db_root, a.dialect, questions_path=a.questions,
                           timeout_s=a.timeout, workers=a.workers, progress=True,
                           suite_check=BirdSuiteCheck(suite_dir) if suite_dir else None)
    return [asdict(v) for v in report.items], {k: v for k, v in report.to_dict().items()
                                                if k != "items"}


def _critic_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", required=True, help="BIRD-CRITIC instances JSONL (with sol_sql)")
    p.add_argument("--pred", required=True, help="predictions JSONL: instance_id + pred_sqls")
    p.add_argument("--db-root", help="SQLite databases: <db_id>/<db_id>.sqlite")
    p.add_argument("--catalog", help="JSON {db_id: {dialect: url}} for server databases")
    p.add_argument("--test-timeout", type=float, default=60.0,
                   help="seconds for each test case's code (the child is killed)")
    _suite_args(p)


def _critic_paths(a: argparse.Namespace) -> list[tuple[str, str | None, str]]:
    return [("--tasks", a.tasks, "file"), ("--pred", a.pred, "file"), ("--db-root", a.db_root, "dir"),
            ("--catalog", a.catalog, "file")]


def _critic_run(a: argparse.Namespace) -> tuple[list[dict], dict]:
    from sqlrl.eval.critic_eval import evaluate_critic, read_predictions
    from sqlrl.suites.evaluation import CriticSuiteCheck
    from sqlrl.tasks.io import read_tasks
    from sqlrl.tasks.types import CriticTask

    tasks = read_tasks(a.tasks)
    others = [t.task_id for t in tasks if not isinstance(t, CriticTask)]
    if others:
        raise SystemExit(f"{a.tasks} holds {len(others)} non-BIRD-CRITIC tasks (e.g. {others[0]})")
    catalog = json.loads(Path(a.catalog).read_text()) if a.catalog else None
    suite_dir = _suite_dir(a)
    check = CriticSuiteCheck(suite_dir, a.timeout) if suite_dir else None  # refuses first
    with _progress("BIRD-CRITIC") as advance:
        report = evaluate_critic(tasks, read_predictions(a.pred), catalog=catalog,
                                 db_root=a.db_root, timeout_s=a.timeout,
                                 test_timeout_s=a.test_timeout, workers=a.workers or 4,
                                 progress=advance, suite_check=check)
    return [i.to_dict() for i in report.items], report.to_dict()


# -- helpers ------------------------------------------------------------------------------------

class _progress:
    """A ``(done, total)`` callback: a rich progress bar in a terminal, otherwise a heartbeat line
    (``jobs.console.Heartbeat``) at least every ``SQLRL_HEARTBEAT_S`` seconds."""

    def __init__(self, label: str) -> None:
        from rich.progress import Progress

        self._tty = console.is_terminal
        self._bar = Progress(console=console, transient=True) if self._tty else None
        self._beat = None if self._tty else Heartbeat(label, unit="instances")
        self._label = label
        self._task = None

    def __enter__(self) -> Callable[[int, int], None]:
        if self._beat is not None:
            return self._beat.__enter__()
        assert self._bar is not None
        self._bar.start()

        def advance(done: int, total: int) -> None:
            assert self._bar is not None
            if self._task is None:
                self._task = self._bar.add_task(self._label, total=total)
            self._bar.update(self._task, completed=done)
        return advance

    def __exit__(self, *exc: object) -> None:
        if self._beat is not None:
            self._beat.__exit__(*exc)
        elif self._bar is not None:
            self._bar.stop()


def _by(rows: list[dict], key: str, excluded: Callable[[dict], bool]) -> dict[str, dict]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if not excluded(r):
            groups.setdefault(str(r.get(key)), []).append(r)
    return {g: {"n": len(v), "matched": sum(bool(r["match"]) for r in v),
                "ex": sum(bool(r["match"]) for r in v) / len(v)} for g, v in sorted(groups.items())}


# -- report tables and the registry (kind -> Evaluator) -------------------------------------------

def _suite_lines(suite: dict | None, names: tuple[str, str, str], scored: int, passed: int,
                 pct: float) -> list[str]:
    """The ``--test-suite`` table under a report: the plain metric (``names``: its label, its
    column, what its passes are called) beside test-suite accuracy; none without a suite."""
    if not suite:
        return []
    label, column, passes = names
    return ["", f"| metric | n | {column} | % |", "|---|---|---|---|",
            f"| {label} | {scored} | {passed} | {pct:.2f} |",
            f"| test-suite | {scored} | {suite['matched']} | {100 * suite['ts']:.2f} |",
            "", f"{passes} that fail the test suite (lucky matches): {suite['lucky']}"]


def _critic_markdown(summary: dict[str, Any]) -> list[str]:
    lines = ["| slice | n | solved | SR% |", "|---|---|---|---|",
             f"| all | {summary['scored']} | {summary['solved']} | {summary['sr']:.2f} |"]
    for key, groups in summary["by"].items():
        for g, s in groups.items():
            lines.append(f"| {key}={g} | {s['n']} | {s['solved']} | {s['sr']:.2f} |")
    lines += _suite_lines(summary.get("test_suite"), ("SR", "solved", "Solved instances"),
                          summary["scored"], summary["solved"], summary["sr"])
    if summary["excluded"]:
        lines += ["", f"Excluded (reference failed): {', '.join(summary['excluded'])}"]
    return lines


def _ex_markdown(summary: dict[str, Any]) -> list[str]:
    """Spider's and BIRD's report: execution accuracy (EX) overall and by difficulty/hardness."""
    overall = summary.get("overall", {"scored": summary.get("scored"),
                                      "matched": summary.get("matched")})
    lines = ["| slice | n | matched | EX% |", "|---|---|---|---|",
             f"| all | {overall['scored']} | {overall['matched']} | {100 * summary['ex']:.2f} |"]
    for g, s in (summary.get("by_difficulty") or summary.get("by_hardness") or {}).items():
        lines.append(f"| {g} | {s.get('scored', s.get('n'))} | {s['matched']} | {100 * s['ex']:.2f} |")
    lines += _suite_lines(summary.get("test_suite"), ("EX", "matched", "EX matches"),
                          overall["scored"], overall["matched"], 100 * summary["ex"])
    if summary.get("gold_errors"):
        lines += ["", f"Excluded (gold failed): items {summary['gold_errors']}"]
    return lines


@dataclass(frozen=True)
class Evaluator:
    """One ``python -m jobs.evaluate <kind>``: everything the job does differently per kind."""

    add_args: Callable[[argparse.ArgumentParser], None]
    paths: Callable[[argparse.Namespace], list[tuple[str, str | None, str]]]  # checked before running
    run: Callable[[argparse.Namespace], tuple[list[dict], dict]]  # -> (verdict rows, summary)
    markdown: Callable[[dict[str, Any]], list[str]]  # the report's table lines from the summary
    own_progress: bool = False  # run reports its own progress (else a heartbeat while it runs)


EVALUATORS: dict[str, Evaluator] = {
    "spider": Evaluator(_spider_args, _spider_paths, _spider_run, _ex_markdown),
    "bird": Evaluator(_bird_args, _bird_paths, _bird_run, _ex_markdown),
    "critic": Evaluator(_critic_args, _critic_paths, _critic_run, _critic_markdown, own_progress=True),
}


def render_markdown(kind: str, summary: dict[str, Any]) -> str:
    return "\n".join([f"# {kind} evaluation", "", *EVALUATORS[kind].markdown(summary)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    # -- parse
    ap = argparse.ArgumentParser(prog="python -m jobs.evaluate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    for kind, evaluator in EVALUATORS.items():
        p = sub.add_parser(kind)
        evaluator.add_args(p)
        p.add_argument("--out", help="output folder (default runs/eval/<kind>-<time>)")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds per SQL statement")
        p.add_argument("--workers", type=int, default=None, help="parallel executions")
    a = ap.parse_args(argv)
    evaluator = EVALUATORS[a.kind]
    out = Path(a.out or f"runs/eval/{a.kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    a.out = str(out)

    # -- check paths: every missing one at once, before any work
    problems = check_paths(evaluator.paths(a))
    if problems:
        for problem in problems:
            console.print(f"evaluate {a.kind}: {problem}", style="red", markup=False, highlight=False)
        return 2

    # -- evaluate
    try:
        if evaluator.own_progress:  # e.g. BIRD-CRITIC's (_progress)
            rows, summary = evaluator.run(a)
        else:
            with Heartbeat(f"evaluate {a.kind}", note="labelling gold and predictions"):
                rows, summary = evaluator.run(a)
    except (OSError, ValueError) as exc:  # FileNotFoundError, a suite folder's OSError, bad input
        console.print(f"evaluate {a.kind}: {exc}", style="red", markup=False, highlight=False)
        return 2

    # -- write
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "verdicts.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "report.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    markdown = render_markdown(a.kind, summary)
    (out / "report.md").write_text(markdown)

    # -- print
    stdout = make_console()
    if not stdout.is_terminal:  # plain markdown, full width
        print(f"{a.kind} — {out}", markdown, sep="\n", end="", flush=True)
        return 0
    table = Table(title=f"{a.kind} — {out}")
    header, *body = [l for l in markdown.splitlines() if l.startswith("|") and "---" not in l]
    for col in header.strip("|").split("|"):
        table.add_column(col.strip())
    for line in body:
        table.add_row(*[c.strip() for c in line.strip("|").split("|")])
    stdout.print(table)
    return 0


if __name__ == "__main__":
    from jobs.stop import exit_on_sigterm

    exit_on_sigterm()  # SIGTERM unwinds through finally: engines and sessions closed
    sys.exit(main())
