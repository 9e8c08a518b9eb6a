"""Multi-dialect variants of SQLite text-to-SQL tasks, kept only when the server agrees with SQLite.

    kept, report = translate_tasks(tasks, {"library": "/data/library.sqlite"}, "postgresql", admin_url)

For each database the tasks use, the SQLite file is loaded onto the server
(``sqlrl.db.provisioning.loader.load_sqlite(..., replace=True)``); each gold query is transpiled with
``sqlglot.transpile(sql, read="sqlite", write=<dialect>)`` and run through a ``sqlrl.db`` session
on the server (as the unprivileged agent role) and on SQLite.

Guarantees:
- A translated task is kept only when both runs succeed and their results are equal as bags of
  rows — as sequences when the gold query's outermost SELECT has ORDER BY. Values are compared
  after ``sqlrl.eval.compare.canonical_value``: booleans become ints, floats are rounded to 9 significant digits
  (``AVG`` is a float on SQLite and NUMERIC on PostgreSQL/MariaDB; sqlrl's ``normalize`` already
  turns Decimal into int when integral, else float), integral floats become ints (``5.0 == 5``),
  and text spelling a canonical integer becomes that integer (the loader stores such columns as
  integers, docs/loader.md). Dates need nothing: sessions return ISO text on every engine.
- Every input task is accounted for: kept, or dropped with a reason in ``report.dropped``
  (``not-sqlite``, ``no-database``, ``load-error``, ``transpile-error``, ``sqlite-error``,
  ``server-error``, ``mismatch``). The input tasks are never modified.
- Kept tasks have ``dialect`` set to the target, the transpiled ``gold_sql``, ``task_id`` suffixed
  with ``@<dialect>``, and ``meta["server_database"]`` / ``meta["sqlite_sql"]``.
  ``report.databases`` maps each db_id to the server database name and agent URL; the caller owns
  them (drop them with ``sqlrl.db.provisioning.provision.drop_database`` when done).
- An unknown target dialect raises ``ValueError`` before anything is created.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import sqlglot

from ..db import Limits, SessionError, open_session
from ..db.dialects.descriptor import dialects, sqlglot_name
from ..db.provisioning.loader import SOURCE_DIALECT, load_sqlite
from ..eval.compare import outer_order_by, same_result
from ..tasks.types import Text2SQLTask, norm_dialect



@dataclass(frozen=True)
class TranslationReport:
    dialect: str
    total: int
    kept: int
    dropped: tuple[tuple[str, str, str], ...]  # (task_id, reason, detail)
    databases: dict[str, tuple[str, str]] = field(default_factory=dict)  # db_id -> (name, session_url)

    @property
    def reasons(self) -> dict[str, int]:
        return dict(Counter(reason for _, reason, _ in self.dropped))


def _catalog(sqlite_catalog: Mapping[str, str] | str | Path) -> Mapping[str, str] | Path:
    return sqlite_catalog if isinstance(sqlite_catalog, Mapping) else Path(sqlite_catalog)


def _sqlite_path(catalog: Mapping[str, str] | Path, db_id: str) -> str | None:
    if isinstance(catalog, Path):
        path = catalog / db_id / f"{db_id}.sqlite"
        return str(path) if path.is_file() else None
    path = catalog.get(db_id)
    return str(path) if path and Path(path).is_file() else None


def translate_tasks(tasks: Iterable[Text2SQLTask], sqlite_catalog: Mapping[str, str] | str | Path,
                    target_dialect: str, admin_url: str, *, name_prefix: str = "synth_",
                    limits: Limits | None = None) -> tuple[list[Text2SQLTask], TranslationReport]:
    """``sqlite_catalog``: ``{db_id: sqlite path}``, or a folder in Spider layout
    (``<folder>/<db_id>/<db_id>.sqlite``). Server databases are named ``name_prefix + db_id``."""
    dialect = norm_dialect(target_dialect)
    targets = [d.name for d in dialects() if d.load is not None]  # what the loader can fill
    if dialect not in targets:
        raise ValueError(f"translate_tasks targets {', '.join(targets)}, not {target_dialect!r}")
    limits = limits or Limits(timeout_s=30, max_rows=10_000)
    catalog = _catalog(sqlite_catalog)
    tasks = list(tasks)
    dropped: list[tuple[str, str, str]] = []
    kept: list[Text2SQLTask] = []
    databases: dict[str, tuple[str, str]] = {}
    failed_loads: dict[str, str] = {}
    by_db: dict[str, list[Text2SQLTask]] = {}
    for t in tasks:
        if t.dialect != SOURCE_DIALECT:
            dropped.append((t.task_id, "not-sqlite", f"source dialect is {t.dialect}"))
        else:
            by_db.setdefault(t.db_id, []).append(t)
    for db_id, group in by_db.items():
        path = _sqlite_path(catalog, db_id)
        if path is None:
            dropped.extend((t.task_id, "no-database", f"no SQLite file for {db_id!r}") for t in group)
            continue
        name = re.sub(r"\W", "_", f"{name_prefix}{db_id}").lower()
        try:
            report = load_sqlite(path, admin_url, name, replace=True)
        except Exception as exc:  # the server refused; every task of this db is dropped, with why
            failed_loads[db_id] = f"{type(exc).__name__}: {exc}"
            dropped.extend((t.task_id, "load-error", failed_loads[db_id]) for t in group)
            continue
        databases[db_id] = (name, report.session_url)
        done = 0
        try:
            with open_session("sqlite:///" + str(Path(path).resolve()), limits=limits) as lite, \
                    open_session(report.session_url, limits=limits) as server:
                for t in group:
                    outcome = _translate_one(t, dialect, lite, server)
                    if isinstance(outcome, tuple):  # (why, detail): dropped
                        dropped.append((t.task_id, *outcome))
                    else:
                        kept.append(replace(outcome, meta={**outcome.meta, "server_database": name}))
                    done += 1
        except SessionError as exc:  # a session could not be opened: the rest of the group is dropped
            dropped.extend((t.task_id, "server-error", f"session: {exc}") for t in group[done:])
    return kept, TranslationReport(dialect, len(tasks), len(kept), tuple(dropped), databases)


def _translate_one(task: Text2SQLTask, dialect: str, lite: Any, server: Any) -> Text2SQLTask | tuple[str, str]:
    try:
        out = sqlglot.transpile(task.gold_sql, read=sqlglot_name(SOURCE_DIALECT),
                                write=sqlglot_name(dialect))
    except sqlglot.errors.SqlglotError as exc:
        return "transpile-error", str(exc).splitlines()[0]
    if len(out) != 1:
        return "transpile-error", f"transpiled into {len(out)} statements"
    sql = out[0]
    a = lite.execute(task.gold_sql)
    if not a.ok:
        return "sqlite-error", str(a.error)
    b = server.execute(sql)
    if not b.ok:
        return "server-error", str(b.error)
    if a.truncated or b.truncated:
        return "mismatch", "result larger than the comparison limit"
    ordered = outer_order_by(task.gold_sql)
    if not same_result(a.rows, b.rows, ordered):
        rows_a, rows_b = (a.rows, b.rows) if ordered else (sorted(a.rows, key=repr), sorted(b.rows, key=repr))
        first = next(((x, y) for x, y in zip(rows_a, rows_b) if x != y), None)
        return "mismatch", (f"sqlite {a.row_count} rows vs {dialect} {b.row_count} rows"
                            + (f"; first difference {first[0]!r} vs {first[1]!r}" if first else ""))
    return replace(task, task_id=f"{task.task_id}@{dialect}", dialect=dialect, gold_sql=sql,
                   meta={**task.meta, "sqlite_sql": task.gold_sql, "sqlite_task_id": task.task_id})


__all__ = ["TranslationReport", "translate_tasks"]
