"""Copy a SQLite database into PostgreSQL or MariaDB/MySQL, so one task runs on several dialects.

    python -m sqlrl.db.provisioning.loader path/to/db.sqlite postgresql://postgres@127.0.0.1:55432/postgres

Guarantees:
- Tables, rows and (when sqlglot can transpile them) views are copied; the row count of every
  table equals the source's. The source file is opened read-only.
- Column types come from the declared type *and* the values actually stored (SQLite's type
  affinity lets any value sit in any column): see ``plan_column`` and docs/loader.md.
- Names are created lower-case (quoted), so SQL that names them unquoted in any case works on
  PostgreSQL, which folds unquoted names to lower case; names differing only in case get a suffix.
- Primary keys are created only when the data is unique and non-null; foreign keys are not created
  (benchmark data often violates them) — they stay documented in the source schema.
- MariaDB/MySQL tables use ``utf8mb4_bin`` so ``=`` compares text case-sensitively, as SQLite does.
- The targets are the engines whose descriptor declares ``load`` (``dialects/engines.py``: column
  types, table options) and an ``admin`` class (its ``load_connection`` and ``insert_rows``).
- The target database is sealed as a base (``provision.seal_database``: no agent account can
  reach it; every session works in its own clone); the report carries the session URL.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import sqlglot

from . import provision
from .admin import admin_ops
from ..dialects.descriptor import Dialect, LoadTypes, dialects, find
from ..types import SessionError
from ..url import dialect_name, parse_url, redact

BATCH_ROWS = 2000
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
_ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?\Z")
_CANONICAL_INT = re.compile(r"-?(0|[1-9]\d{0,17})\Z")  # no leading zeros; fits in BIGINT
_DECIMAL = re.compile(r"(?:DECIMAL|NUMERIC)\s*\(\s*(\d+)\s*(?:,\s*(\d+))?\s*\)", re.I)


@dataclass(frozen=True)
class ColumnPlan:
    table: str
    source: str  # the SQLite column name
    target: str  # the created (lower-case) name
    declared: str  # the SQLite declared type
    kind: str  # portable kind: integer, real, decimal, date, timestamp, text, blob
    sql_type: str  # the target engine's type
    reason: str


@dataclass(frozen=True)
class LoadReport:
    database: str
    dialect: str
    session_url: str
    rows: tuple[tuple[str, int], ...]  # (target table, rows loaded)
    columns: tuple[ColumnPlan, ...]
    primary_keys: tuple[str, ...]  # tables given a primary key
    views: tuple[str, ...]  # views recreated
    skipped_views: tuple[tuple[str, str], ...]  # (view, why)
    seconds: float


# --- deciding column types -------------------------------------------------------------------------

def _affinity(declared: str) -> str:
    """SQLite's column affinity rules (https://sqlite.org/datatype3.html, section 3.1)."""
    d = declared.upper()
    if "INT" in d:
        return "integer"
    if any(k in d for k in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not d or "BLOB" in d:
        return "blob"
    if any(k in d for k in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


@dataclass
class _Values:
    types: set[type]
    max_len: int
    all_dates: bool
    all_datetimes: bool
    all_int_text: bool  # every value is an int or text spelling a canonical integer


def _scan(values: Iterable[Any]) -> _Values:
    types: set[type] = set()
    max_len, dates, datetimes, seen_text, int_text = 0, True, True, False, True
    for v in values:
        if v is None:
            continue
        types.add(type(v))
        if isinstance(v, str):
            seen_text = True
            int_text = int_text and bool(_CANONICAL_INT.match(v))
            max_len = max(max_len, len(v))
            dates = dates and bool(_ISO_DATE.match(v))
            datetimes = datetimes and bool(_ISO_DATETIME.match(v) or _ISO_DATE.match(v))
        elif isinstance(v, bytes):
            max_len = max(max_len, len(v))
        elif not isinstance(v, int):
            int_text = False
    return _Values(types, max_len, dates and seen_text, datetimes and seen_text,
                   int_text and seen_text)


def plan_column(declared: str, values: _Values) -> tuple[str, str]:
    """(kind, reason) for a column, from its declared type and the values it holds."""
    t = values.types
    numeric = t <= {int, float}
    affinity = _affinity(declared)
    if not t:
        return {"integer": "integer", "real": "real", "text": "text"}.get(affinity, "text"), "no values"
    if affinity in ("integer", "real", "numeric", "blob") and numeric:
        m = _DECIMAL.search(declared)
        if m and affinity == "numeric" and _fits_decimal(values, int(m.group(1)), int(m.group(2) or 0)):
            return "decimal", "declared DECIMAL/NUMERIC and every value fits"
        if t == {int}:
            return "integer", "every value is an integer"
        return "real", "every value is a number"
    if t == {str} and affinity in ("numeric", "blob", "text") and any(
            k in declared.upper() for k in ("DATE", "TIME")):
        if values.all_dates:
            return "date", "declared a date type and every value is an ISO date"
        if values.all_datetimes:
            return "timestamp", "declared a date/time type and every value is an ISO date-time"
    if values.all_int_text and not any(k in declared.upper() for k in ("DATE", "TIME")):
        return "integer", ("every value is an integer or text spelling one (SQLite compares such "
                           "text numerically against numeric columns and literals)")
    if t == {bytes}:
        return "blob", "every value is bytes"
    return "text", ("declared text" if affinity == "text" and t == {str}
                    else f"mixed or non-numeric values ({', '.join(sorted(x.__name__ for x in t))})")


def _fits_decimal(values: _Values, precision: int, scale: int) -> bool:
    return 0 < precision <= 65 and scale <= precision  # values are checked on insert by the server


# --- engine specifics: the target's descriptor (``dialects/engines.py``) ------------------------------

SOURCE_DIALECT = "sqlite"  # what the loader reads: SQLite files (through the stdlib's sqlite3)


@dataclass(frozen=True)
class _Target:
    engine: Dialect  # quoting, sqlglot name, ``load``: the column types and table options
    ops: Any  # the engine's admin operations: ``load_connection`` and ``insert_rows``

    @property
    def load(self) -> LoadTypes:
        assert self.engine.load is not None
        return self.engine.load


def _target(dialect: str) -> _Target:
    engine = find(dialect)
    if engine is None or engine.load is None or engine.admin is None:
        raise SessionError(f"the loader supports {', '.join(d.name for d in dialects() if d.load)}, "
                           f"not {dialect!r}")
    return _Target(engine, admin_ops(engine.name))


# --- loading ---------------------------------------------------------------------------------------

def _target_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        candidate, i = name.lower(), 2
        while candidate in out:
            candidate, i = f"{name.lower()}_{i}", i + 1
        out.append(candidate)
    return out


def _convert(kind: str) -> Callable[[Any], Any]:
    def integer(v: Any) -> Any:
        return int(v) if isinstance(v, str) else v

    def text(v: Any) -> Any:
        if v is None or isinstance(v, str):
            return None if v is None else v.replace("\x00", "")
        if isinstance(v, bytes):
            return v.decode("utf-8", "replace").replace("\x00", "")
        return str(v)
    if kind == "integer":
        return integer
    return text if kind in ("text", "date", "timestamp") else (lambda v: v)


def _sql_type(target: _Target, kind: str, declared: str) -> str:
    if kind == "decimal":
        m = _DECIMAL.search(declared)
        return f"NUMERIC({m.group(1)}, {m.group(2) or 0})" if m else target.load.types["real"]
    return target.load.types[kind]


def load_sqlite(sqlite_path: str, admin_url: str, name: str | None = None, *,
                replace: bool = False) -> LoadReport:
    """Create database ``name`` (default: the file's stem, lower-cased) on the server at
    ``admin_url`` and copy the SQLite database at ``sqlite_path`` into it."""
    t0 = time.perf_counter()
    url = parse_url(admin_url)
    dialect = dialect_name(url)
    target = _target(dialect)
    name = name or re.sub(r"\W", "_", sqlite_path.rsplit("/", 1)[-1].rsplit(".", 1)[0]).lower()
    try:
        src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
        src.text_factory = lambda b: b.decode("utf-8", "replace")
        tables = [r[0] for r in src.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' ORDER BY rowid")]
    except sqlite3.Error as exc:
        raise SessionError(f"cannot read SQLite database {sqlite_path}: {exc}") from exc
    provision.create_database(admin_url, name, replace=replace)
    conn = target.ops.load_connection(url, name)
    plans: list[ColumnPlan] = []
    counts: list[tuple[str, int]] = []
    keyed: list[str] = []
    try:
        for table, table_target in zip(tables, _target_names(tables)):
            info = src.execute(f'PRAGMA table_info("{table}")').fetchall()
            names = [r[1] for r in info]
            targets = _target_names(names)
            pk_cols = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5] > 0]
            columns = []
            for (cid, col, declared, _nn, _d, _pk), col_target in zip(info, targets):
                values = _scan(v for (v,) in src.execute(f'SELECT "{col}" FROM "{table}"'))
                kind, reason = plan_column(declared or "", values)
                sql_type = _sql_type(target, kind, declared or "")
                columns.append((col, col_target, kind, sql_type, values))
                plans.append(ColumnPlan(table_target, col, col_target, declared or "", kind, sql_type, reason))
            key_sql = _primary_key(src, table, pk_cols, columns, target)
            defs = [f"{target.engine.quote(c[1])} {key_sql[1].get(c[0], c[3])}" for c in columns]
            if key_sql[0]:
                defs.append(key_sql[0])
                keyed.append(table_target)
            qt = target.engine.quote(table_target)
            with conn.cursor() as cur:
                cur.execute(f"CREATE TABLE {qt} ({', '.join(defs)}){target.load.table_suffix}")
            converters = [_convert(c[2]) for c in columns]
            quoted = [target.engine.quote(c[1]) for c in columns]
            n = 0
            cursor = src.execute(f'SELECT {", ".join(chr(34) + c + chr(34) for c in names)} FROM "{table}"')
            while batch := cursor.fetchmany(BATCH_ROWS):
                target.ops.insert_rows(conn, qt, quoted, [tuple(f(v) for f, v in zip(converters, row)) for row in batch])
                n += len(batch)
            counts.append((table_target, n))
        conn.commit()
        views, skipped = _copy_views(src, conn, target)
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()
        src.close()
    provision.prepare_server(admin_url)
    provision.seal_database(admin_url, name)
    return LoadReport(name, dialect, provision.session_url(admin_url, name), tuple(counts),
                      tuple(plans), tuple(keyed), tuple(views), tuple(skipped),
                      time.perf_counter() - t0)


def _primary_key(src: sqlite3.Connection, table: str, pk_cols: list[str], columns: list[tuple],
                 target: _Target) -> tuple[str, dict[str, str]]:
    """(PRIMARY KEY clause or "", type overrides for key columns) when the data is a valid key."""
    if not pk_cols:
        return "", {}
    cols = ", ".join(f'"{c}"' for c in pk_cols)
    nulls = " OR ".join(f'"{c}" IS NULL' for c in pk_cols)
    total, distinct = src.execute(
        f'SELECT count(*), (SELECT count(*) FROM (SELECT DISTINCT {cols} FROM "{table}")) FROM "{table}"').fetchone()
    has_null = src.execute(f'SELECT 1 FROM "{table}" WHERE {nulls} LIMIT 1').fetchone()
    if total != distinct or has_null:
        return "", {}
    overrides: dict[str, str] = {}
    by_source = {c[0]: c for c in columns}
    for c in pk_cols:
        _, _, kind, _, values = by_source[c]
        if kind in ("text", "blob"):
            key_type = target.load.key_text_type(values.max_len)
            if key_type is None:
                return "", {}
            overrides[c] = key_type
    quoted = ", ".join(target.engine.quote(by_source[c][1]) for c in pk_cols)
    return f"PRIMARY KEY ({quoted})", overrides


def _copy_views(src: sqlite3.Connection, conn: Any, target: _Target) -> tuple[list[str], list[tuple[str, str]]]:
    views, skipped = [], []
    for view, sql in src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid"):
        try:
            translated = sqlglot.transpile(sql, read="sqlite", write=target.engine.sqlglot)[0]
            with conn.cursor() as cur:
                cur.execute(translated)
            conn.commit()
            views.append(view.lower())
        except Exception as exc:  # a view the target cannot express: recorded, not fatal
            conn.rollback()
            skipped.append((view, " ".join(str(exc).split())[:200]))
    return views, skipped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Copy a SQLite database into PostgreSQL or MariaDB/MySQL.")
    parser.add_argument("sqlite_path")
    parser.add_argument("admin_url", help="an admin URL of the server, e.g. postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--name", help="target database name (default: the file's stem)")
    parser.add_argument("--replace", action="store_true", help="drop the target database first")
    args = parser.parse_args(argv)
    report = load_sqlite(args.sqlite_path, args.admin_url, args.name, replace=args.replace)
    print(f"loaded {args.sqlite_path} into {report.dialect} database {report.database!r} "
          f"in {report.seconds:.2f}s")
    for table, n in report.rows:
        print(f"  {table}: {n} rows" + (" (primary key)" if table in report.primary_keys else ""))
    for view, why in report.skipped_views:
        print(f"  view {view} skipped: {why}")
    print(f"session URL (each session gets its own clone): {redact(report.session_url)}")


if __name__ == "__main__":
    main()
