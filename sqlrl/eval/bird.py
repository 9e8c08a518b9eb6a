"""BIRD execution accuracy (``evaluation_ex.py`` semantics) over sqlrl sessions.

    report = evaluate_bird("predict_mini_dev.json", "mini_dev_sqlite_gold.sql", "dev_databases/",
                           questions_path="mini_dev_sqlite.json")
    report.ex, report.by_difficulty["challenging"].ex

Inputs are the official mini-dev ones: predictions as a JSON object ``{"0": "SQL\\t----- bird
-----\\tdb_id", ...}``, gold lines ``SQL<TAB>db_id``, difficulty from the questions file (JSON array
or JSONL, field ``difficulty``, by position).

Guarantees:
- A pair matches when ``compare.bird_ex``: the two results are equal as sets of rows.
- As in the official ``package_sqls``: a prediction string is cut at the ``----- bird -----``
  separator when it holds exactly one (else the whole stripped string is the SQL); a non-string
  prediction is an error; the database is always the gold line's. Predictions pair with gold lines
  by their integer key ("0", "1", ...); other keys raise ``ValueError``.
- The drivers the official evaluator uses run one statement per call on SQLite and MySQL (more is
  an error) and several on PostgreSQL; that rule is kept (``Dialect.one_statement_per_call``).
- All SQL runs through ``sqlrl.db`` sessions (``spider.QueryRunner``: each distinct query once,
  a per-statement timeout, no query sees another's writes). Fail-closed: an erroring, timed-out or over-cap prediction scores 0. A
  gold that fails is flagged, reported in ``gold_errors`` and excluded from the denominators (the
  official script would count it as a 0).
- Databases: SQLite at ``<db_root>/<db_id>/<db_id>.sqlite``; PostgreSQL/MySQL ``db_root`` is a
  session URL, where ``{db_id}`` (if present) is replaced by the item's database (``database_url``;
  ``Dialect.file_based`` decides which).

- Test-suite accuracy (``suite_check``, ``sqlrl.suites.evaluation.BirdSuiteCheck``): every EX
  match is also checked on its gold's distilled database variants with the same ``bird_ex``
  (``suite_match``, ``suite_failed_on``; ``report.to_dict()["test_suite"]``: accuracy, matches,
  and ``lucky``, the EX matches that fail the suite). The hook's ``refuse(urls)`` runs before any
  query (a database it cannot fuzz is an error, not a silent pass).

Known differences from the official script: its 30 s timeout covers the pair, ours each query;
it runs prediction then gold on one connection, we run them apart (a prediction's writes cannot
change the gold's result); values are normalised by ``sqlrl.db`` (Decimal -> int or
float, dates -> ISO text), which only matters on PostgreSQL/MySQL.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from sqlrl.db.dialects.descriptor import FileCopy, dialect_of, dialects
from sqlrl.db.statements import split_statements
from sqlrl.tasks.types import norm_dialect

from .compare import bird_ex
from .spider import QueryRunner, eval_limits, stderr_progress, suite_summary

SEPARATOR = "\t----- bird -----\t"
DIFFICULTY_ORDER = ("simple", "moderate", "challenging")


def database_url(dialect: str, db_root: str, db_id: str) -> str:
    """The session URL of database ``db_id``: for an engine whose databases are files, its file
    in the folder ``db_root`` by the engine's storage layout (``FileCopy.path_in``: SQLite's is
    BIRD's ``<db_root>/<db_id>/<db_id>.sqlite``), else ``db_root`` as a URL template."""
    engine = dialect_of(dialect)
    if isinstance(engine.storage, FileCopy):
        return engine.file_url(engine.storage.path_in(db_root, db_id).resolve())
    return db_root.replace("{db_id}", db_id)


@dataclass(frozen=True)
class BirdVerdict:
    index: int
    db_id: str
    gold: str
    pred: str | None
    match: bool
    pred_error: str | None = None
    gold_error: str | None = None
    difficulty: str | None = None
    suite_match: bool | None = None  # with a test suite: match here and on every suite variant
    suite_failed_on: str | None = None  # the variant an EX match missed (a lucky match)


class BirdSuiteHook(Protocol):
    """What ``label_bird``/``evaluate_bird`` take as ``suite_check``
    (``sqlrl.suites.evaluation.BirdSuiteCheck``; passed in: suites are a layer above)."""

    def refuse(self, urls: Sequence[str]) -> None:
        """Raise (``ValueError``/``FileNotFoundError``) before any query when a database cannot
        have a suite."""

    def __call__(self, verdicts: Sequence[BirdVerdict], urls: Sequence[str],
                 runner: QueryRunner) -> list[BirdVerdict]:
        """``verdicts`` with ``suite_match`` set, checked through ``runner``."""


@dataclass(frozen=True)
class Score:
    count: int  # items
    scored: int  # items whose gold ran
    matched: int

    @property
    def ex(self) -> float:
        return self.matched / self.scored if self.scored else 0.0


@dataclass(frozen=True)
class BirdReport:
    items: tuple[BirdVerdict, ...]
    overall: Score
    by_difficulty: dict[str, Score]
    gold_errors: tuple[int, ...]
    queries_executed: int
    elapsed_s: float
    dialect: str = "sqlite"

    @property
    def ex(self) -> float:
        return self.overall.ex

    def to_dict(self) -> dict[str, Any]:
        score = lambda s: {**asdict(s), "ex": s.ex}  # noqa: E731
        out = {"dialect": self.dialect, "ex": self.ex, "overall": score(self.overall),
               "by_difficulty": {k: score(v) for k, v in self.by_difficulty.items()},
               "gold_errors": list(self.gold_errors), "queries_executed": self.queries_executed,
               "elapsed_s": self.elapsed_s, "items": [asdict(v) for v in self.items]}
        suite = suite_summary(self.items, self.overall.scored)
        if suite is not None:
            out["test_suite"] = suite
        return out


# -- the official input files ---------------------------------------------------------------------

def parse_bird_pred(value: Any) -> str | None:
    """The SQL of one prediction value (``None`` when it is not a string)."""
    if not isinstance(value, str):
        return None
    parts = value.split(SEPARATOR)
    return parts[0] if len(parts) == 2 else value.strip()


def read_bird_pred(path: str | Path) -> list[str | None]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: predictions must be a JSON object {{\"0\": \"SQL\\t----- bird "
                         f"-----\\tdb_id\", ...}}, got {type(data).__name__}")
    try:
        keys = {int(k): k for k in data}
    except ValueError as exc:
        raise ValueError(f"{path}: prediction keys must be integers \"0\"..\"n-1\" ({exc})") from exc
    if sorted(keys) != list(range(len(data))):
        missing = sorted(set(range(len(data))) - set(keys))[:5]
        raise ValueError(f"{path}: prediction keys must be \"0\"..\"{len(data) - 1}\"; "
                         f"missing e.g. {missing}")
    return [parse_bird_pred(data[keys[i]]) for i in range(len(data))]


def read_bird_gold(path: str | Path) -> list[tuple[str, str]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for lineno, line in enumerate(lines, 1):
        fields = line.strip().split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise ValueError(f"{path}:{lineno}: a gold line must be 'SQL<TAB>db_id', got "
                             f"{len(fields)} TAB-separated field(s): {line[:120]!r}")
        out.append((fields[0], fields[1]))
    return out


def read_bird_difficulty(path: str | Path) -> list[str]:
    """``difficulty`` of each question, from a JSON array or a JSONL file."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        records = None
    if not isinstance(records, list):
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: neither a JSON array nor JSONL ({exc})") from exc
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not isinstance(rec.get("difficulty"), str):
            raise ValueError(f"{path}: record {i} has no string 'difficulty'")
        out.append(rec["difficulty"])
    return out


# -- labelling ------------------------------------------------------------------------------------

def statement_rule(dialect: str) -> Callable[[str], str | None]:
    """The official driver's rule (``Dialect.one_statement_per_call``): a prediction holding
    several statements is a syntax error on SQLite and MySQL, runs on PostgreSQL."""
    engine = dialect_of(dialect)
    single = engine.one_statement_per_call

    def check(sql: str) -> str | None:
        if single and len(split_statements(sql, engine.sqlglot)) > 1:
            return f"syntax error: one statement at a time on {dialect} (as the official driver)"
        return None
    return check


def label_bird(pairs: Iterable[Sequence[Any]], db_root: str | Path, dialect: str = "sqlite", *,
               difficulties: Sequence[str] | None = None, timeout_s: float = 30.0,
               workers: int | None = None, progress: bool = False) -> list[BirdVerdict]:
    """Label (db_id, gold, pred) triples (pred may be ``None``: an unusable prediction)."""
    dialect = _dialect(dialect)
    with QueryRunner(eval_limits(timeout_s), workers, check=statement_rule(dialect)) as runner:
        return _label(list(pairs), str(db_root), dialect, difficulties, runner, progress)


def _dialect(name: str) -> str:
    """The dialect's name; BIRD evaluation supports the verified engines (their official drivers'
    one-statement rule is known)."""
    dialect = norm_dialect(name)
    if not dialect_of(dialect).verified:
        supported = ", ".join(d.name for d in dialects() if d.verified)
        raise ValueError(f"BIRD evaluation supports {supported}; got {name!r}")
    return dialect


def _label(items: list[Sequence[Any]], db_root: str, dialect: str,
           difficulties: Sequence[str] | None, runner: QueryRunner,
           progress: bool, suite_check: BirdSuiteHook | None = None) -> list[BirdVerdict]:
    if difficulties is not None and len(difficulties) != len(items):
        raise ValueError(f"{len(difficulties)} difficulties for {len(items)} predictions")
    urls = [database_url(dialect, db_root, db_id) for db_id, _, _ in items]
    if suite_check is not None:
        suite_check.refuse(urls)
    golds = runner.run_many([(u, g) for u, (_, g, _) in zip(urls, items)],
                            stderr_progress("bird gold") if progress else None)
    preds = runner.run_many(
        [(u, p) for u, (_, g, p) in zip(urls, items)
         if isinstance(p, str) and golds[(u, g)].error is None],
        stderr_progress("bird pred") if progress else None)
    verdicts = []
    for i, (url, (db_id, gold, pred)) in enumerate(zip(urls, items)):
        g = golds[(url, gold)]
        match, perr = False, None
        if g.error is None:
            if not isinstance(pred, str):
                perr = "the prediction is not a string"
            else:
                p = preds[(url, pred)]
                perr = p.error
                match = p.error is None and bird_ex(p.rows, g.rows)
        verdicts.append(BirdVerdict(i, db_id, gold, pred, match, perr, g.error,
                                    None if difficulties is None else difficulties[i]))
    return verdicts if suite_check is None else suite_check(verdicts, urls, runner)


def _score(items: Sequence[BirdVerdict]) -> Score:
    return Score(count=len(items), scored=sum(v.gold_error is None for v in items),
                 matched=sum(v.match for v in items))


def evaluate_bird(pred_json_path: str | Path, gold_sql_path: str | Path, db_root: str | Path,
                  dialect: str = "sqlite", *, questions_path: str | Path | None = None,
                  timeout_s: float = 30.0, workers: int | None = None,
                  progress: bool = True, suite_check: BirdSuiteHook | None = None) -> BirdReport:
    """BIRD execution accuracy of a predictions JSON against a gold SQL file, overall and by
    difficulty (when ``questions_path`` is given); with ``suite_check``, test-suite accuracy too
    (module doc)."""
    t0 = time.perf_counter()
    dialect = _dialect(dialect)
    preds = read_bird_pred(pred_json_path)
    gold = read_bird_gold(gold_sql_path)
    if len(preds) != len(gold):
        raise ValueError(f"{pred_json_path} has {len(preds)} predictions but {gold_sql_path} has "
                         f"{len(gold)} gold queries")
    difficulties = read_bird_difficulty(questions_path) if questions_path is not None else None
    if difficulties is not None and len(difficulties) != len(gold):
        raise ValueError(f"{questions_path} has {len(difficulties)} questions but {gold_sql_path} "
                         f"has {len(gold)} gold queries")
    if dialect_of(dialect).file_based and not Path(db_root).is_dir():
        raise FileNotFoundError(f"BIRD database folder not found: {db_root}")
    with QueryRunner(eval_limits(timeout_s), workers, check=statement_rule(dialect)) as runner:
        verdicts = _label([(db, g, p) for (g, db), p in zip(gold, preds)], str(db_root), dialect,
                          difficulties, runner, progress, suite_check)
        executed = runner.executed
    by: dict[str, list[BirdVerdict]] = {}
    for v in verdicts:
        if v.difficulty is not None:
            by.setdefault(v.difficulty, []).append(v)
    order = [d for d in DIFFICULTY_ORDER if d in by] + sorted(set(by) - set(DIFFICULTY_ORDER))
    return BirdReport(items=tuple(verdicts), overall=_score(verdicts),
                      by_difficulty={d: _score(by[d]) for d in order},
                      gold_errors=tuple(v.index for v in verdicts if v.gold_error is not None),
                      queries_executed=executed, elapsed_s=time.perf_counter() - t0,
                      dialect=dialect)
