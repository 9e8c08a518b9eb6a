"""Database schemas as values: tables, columns, primary and foreign keys, and CREATE TABLE text.

Two sources: a Spider/BIRD ``tables.json`` entry (``DatabaseSchema.from_tables_json``) and a live
SQLite file (``DatabaseSchema.from_sqlite``, read-only introspection through PRAGMAs; this is schema
reading, not query execution -- agent and gold SQL run through ``sqlrl.db`` sessions only).

Guarantees:
- ``ColumnSchema`` / ``ForeignKey`` / ``TableSchema`` / ``DatabaseSchema`` are frozen dataclasses
  of str / bool / tuples: hashable, picklable, safe across Ray actor boundaries.
- ``to_create_sql(dialect)`` renders one ``CREATE TABLE`` statement per table (``;``-terminated,
  blank-line separated) in which every identifier that is not a plain word, or that is a reserved
  word, is quoted the dialect's way; for SQLite the output executes on an empty database for every
  Spider and BIRD ``tables.json`` schema (tested). SQLite's internal ``sqlite_*`` tables (Spider
  lists ``sqlite_sequence``) are left out of the schema. Types are shown as declared;
  Spider's generic types (``number``, ``text``, ``time``, ``boolean``, ``others``) are mapped to
  SQL types, and for other dialects types are transpiled by sqlglot when it knows them. Names
  are rendered as the source spells them: a database loaded into PostgreSQL/MariaDB by
  ``sqlrl.db.loader`` has lower-cased names, so render its prompt from that database instead.
- Malformed ``tables.json`` entries raise ``TaskError`` naming the database and the field.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from .types import TaskError, norm_dialect

__all__ = ["ColumnSchema", "ForeignKey", "TableSchema", "DatabaseSchema", "quote_identifier"]


@dataclass(frozen=True)
class ColumnSchema:
    name: str
    type: str = ""  # as declared ("varchar(255)", "INTEGER") or tables.json's word ("number")
    not_null: bool = False
    description: str = ""  # tables.json's natural-language column name when it says more


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[ColumnSchema, ...]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()

    def column(self, name: str) -> ColumnSchema:
        for c in self.columns:
            if c.name.lower() == name.lower():
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    def to_create_sql(self, dialect: str = "sqlite") -> str:
        dialect = norm_dialect(dialect)
        q = lambda n: quote_identifier(n, dialect)  # noqa: E731
        lines = []
        for col in self.columns:
            typ = _render_type(col.type, dialect)
            lines.append(" ".join(p for p in (q(col.name), typ, "NOT NULL" if col.not_null else "") if p))
        if self.primary_key:
            lines.append(f"PRIMARY KEY ({', '.join(q(c) for c in self.primary_key)})")
        for fk in self.foreign_keys:
            lines.append(f"FOREIGN KEY ({', '.join(q(c) for c in fk.columns)}) REFERENCES "
                         f"{q(fk.ref_table)} ({', '.join(q(c) for c in fk.ref_columns)})")
        body = ",\n".join("  " + line for line in lines)
        return f"CREATE TABLE {q(self.name)} (\n{body}\n);"


@dataclass(frozen=True)
class DatabaseSchema:
    db_id: str
    tables: tuple[TableSchema, ...]

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def table(self, name: str) -> TableSchema:
        for t in self.tables:
            if t.name.lower() == name.lower():
                return t
        raise KeyError(f"database {self.db_id!r} has no table {name!r}")

    def to_create_sql(self, dialect: str = "sqlite") -> str:
        """One ``CREATE TABLE …;`` per table, in schema order, separated by a blank line."""
        return "\n\n".join(t.to_create_sql(dialect) for t in self.tables)

    # -- sources ---------------------------------------------------------------------------------

    @classmethod
    def from_tables_json(cls, entry: dict[str, Any]) -> "DatabaseSchema":
        """From one entry of Spider's / BIRD's ``tables.json`` (original, not normalised, names)."""
        if not isinstance(entry, dict):
            raise TaskError(f"a tables.json entry must be an object, got {type(entry).__name__}")
        db_id = entry.get("db_id")
        if not isinstance(db_id, str) or not db_id:
            raise TaskError("tables.json entry has no 'db_id'")
        try:
            tables = list(entry["table_names_original"])
            cols = [(int(t), str(n)) for t, n in entry["column_names_original"]]
            types = list(entry["column_types"])
            natural = [str(n) for _, n in entry.get("column_names") or [(0, "")] * len(cols)]
            pk_items = list(entry.get("primary_keys") or [])
            fk_items = [(int(a), int(b)) for a, b in entry.get("foreign_keys") or []]
        except KeyError as exc:
            raise TaskError(f"tables.json entry {db_id!r} lacks field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise TaskError(f"tables.json entry {db_id!r} is malformed: {exc}") from None
        if len(types) != len(cols):
            raise TaskError(f"tables.json entry {db_id!r}: {len(cols)} columns but "
                            f"{len(types)} column_types")
        if len(natural) != len(cols):
            natural = [""] * len(cols)

        def col_ref(i: int) -> tuple[int, str]:
            if not 0 <= i < len(cols) or cols[i][0] < 0 or cols[i][0] >= len(tables):
                raise TaskError(f"tables.json entry {db_id!r}: column index {i} is out of range")
            return cols[i]

        pks: dict[int, list[str]] = {}
        for item in pk_items:  # an int, or a list of ints for a composite key (BIRD)
            for i in (item if isinstance(item, list) else [item]):
                t, name = col_ref(int(i))
                if name not in pks.setdefault(t, []):
                    pks[t].append(name)
        fks: dict[int, list[ForeignKey]] = {}
        for a, b in fk_items:  # one (column, referenced column) pair per entry
            (ta, na), (tb, nb) = col_ref(a), col_ref(b)
            fk = ForeignKey((na,), str(tables[tb]), (nb,))
            if fk not in fks.setdefault(ta, []):
                fks[ta].append(fk)
        out = []
        for t, tname in enumerate(tables):
            if str(tname).lower().startswith("sqlite_"):  # SQLite's own (sqlite_sequence)
                continue
            columns = tuple(
                ColumnSchema(name=n, type=str(types[i]),
                             description=natural[i] if _says_more(natural[i], n) else "")
                for i, (ti, n) in enumerate(cols) if ti == t)
            out.append(TableSchema(str(tname), columns, tuple(pks.get(t, ())), tuple(fks.get(t, ()))))
        return cls(db_id, tuple(out))

    @classmethod
    def from_sqlite(cls, path: str | Path, db_id: str | None = None) -> "DatabaseSchema":
        """Introspect a SQLite file, opened read-only (``mode=ro``); raises FileNotFoundError."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SQLite database file not found: {path}")
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY rowid")]
            infos = {n: conn.execute(f"PRAGMA table_info({_sqlite_quote(n)})").fetchall() for n in names}
            fk_rows = {n: conn.execute(f"PRAGMA foreign_key_list({_sqlite_quote(n)})").fetchall()
                       for n in names}
        finally:
            conn.close()
        pk_of = {n.lower(): tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
                 for n, info in infos.items()}
        tables = []
        for n in names:
            columns = tuple(ColumnSchema(name=r[1], type=r[2] or "", not_null=bool(r[3]))
                            for r in infos[n])
            groups: dict[int, list[tuple]] = {}
            for r in fk_rows[n]:  # (id, seq, table, from, to, on_update, on_delete, match)
                groups.setdefault(r[0], []).append(r)
            fks = []
            for _, rows in sorted(groups.items()):
                rows.sort(key=lambda r: r[1])
                ref = rows[0][2]
                to = tuple(r[4] for r in rows)
                if any(t is None for t in to):  # "REFERENCES t" alone: the referenced primary key
                    to = pk_of.get(ref.lower(), ()) or to
                if any(t is None for t in to):
                    continue
                fks.append(ForeignKey(tuple(r[3] for r in rows), ref, to))
            tables.append(TableSchema(n, columns, pk_of[n.lower()], tuple(fks)))
        return cls(db_id or path.stem, tuple(tables))


# -- rendering helpers ---------------------------------------------------------------------------

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUOTES = {"sqlite": ('"', '"'), "postgresql": ('"', '"'), "oracle": ('"', '"'),
           "mysql": ("`", "`"), "mssql": ("[", "]")}
_SQLGLOT = {"sqlite": "sqlite", "postgresql": "postgres", "mysql": "mysql", "mssql": "tsql",
            "oracle": "oracle"}
# Spider's generic column types (tables.json) -> a SQL type per dialect family.
_GENERIC_TYPES = {"number": "NUMERIC", "text": "TEXT", "time": "DATETIME", "boolean": "BOOLEAN",
                  "others": "TEXT"}


# Words quoted when used as names: PostgreSQL's reserved words and SQLite's keywords (so a name
# like ``order`` or ``key`` is always quoted), plus per-dialect extras; MySQL's list is sqlglot's.
_RESERVED = frozenset("""
ABORT ACTION ADD AFTER ALL ALTER ANALYSE ANALYZE AND ANY ARRAY AS ASC ASYMMETRIC ATTACH
AUTHORIZATION AUTOINCREMENT BEFORE BEGIN BETWEEN BINARY BOTH BY CASCADE CASE CAST CHECK COLLATE
COLLATION COLUMN COMMIT CONCURRENTLY CONFLICT CONSTRAINT CREATE CROSS CURRENT_CATALOG CURRENT_DATE
CURRENT_ROLE CURRENT_SCHEMA CURRENT_TIME CURRENT_TIMESTAMP CURRENT_USER DATABASE DEFAULT DEFERRABLE
DEFERRED DELETE DESC DETACH DISTINCT DO DROP EACH ELSE END ESCAPE EXCEPT EXCLUSIVE EXISTS EXPLAIN
FAIL FALSE FETCH FOR FOREIGN FREEZE FROM FULL GLOB GRANT GROUP HAVING IF IGNORE ILIKE IMMEDIATE IN
INDEX INDEXED INITIALLY INNER INSERT INSTEAD INTERSECT INTO IS ISNULL JOIN KEY LATERAL LEADING LEFT
LIKE LIMIT LOCALTIME LOCALTIMESTAMP MATCH NATURAL NO NOT NOTHING NOTNULL NULL OF OFFSET ON ONLY OR
ORDER OUTER OVERLAPS PLACING PLAN PRAGMA PRIMARY QUERY RAISE RECURSIVE REFERENCES REGEXP REINDEX
RELEASE RENAME REPLACE RESTRICT RETURNING RIGHT ROLLBACK ROW ROWS SAVEPOINT SELECT SESSION_USER SET
SIMILAR SOME SYMMETRIC TABLE TABLESAMPLE TEMP TEMPORARY THEN TO TRAILING TRANSACTION TRIGGER TRUE
UNION UNIQUE UPDATE USER USING VACUUM VALUES VARIADIC VERBOSE VIEW VIRTUAL WHEN WHERE WINDOW WITH
""".split())
_EXTRA_RESERVED = {
    "oracle": frozenset("ACCESS COMMENT DATE FILE LEVEL MODE NUMBER RESOURCE ROWID ROWNUM SIZE "
                        "START UID".split()),
    "mssql": frozenset("BACKUP BREAK BROWSE BULK CLUSTERED COMPUTE CONTAINS DENY DISK DUMP ERRLVL "
                       "EXEC EXECUTE EXIT FILE FILLFACTOR FREETEXT IDENTITY KILL LINENO LOAD "
                       "MERGE NATIONAL OPEN OPTION OVER PERCENT PIVOT PRINT PROC PROCEDURE PUBLIC "
                       "READ RETURN REVERT REVOKE RULE SCHEMA SHUTDOWN STATISTICS TOP TRAN "
                       "TRUNCATE UNPIVOT USE WAITFOR WHILE".split()),
}


@lru_cache(maxsize=None)
def _keywords(dialect: str) -> frozenset[str]:
    words = set(_RESERVED) | _EXTRA_RESERVED.get(dialect, frozenset())
    if dialect == "mysql":
        from sqlglot.dialects.mysql import MySQL

        words |= {k.upper() for k in MySQL.Generator.RESERVED_KEYWORDS}
    return frozenset(words)


def quote_identifier(name: str, dialect: str = "sqlite") -> str:
    """``name`` as the dialect writes it: bare when a plain non-keyword word, else quoted."""
    dialect = norm_dialect(dialect)
    if _PLAIN.match(name) and name.upper() not in _keywords(dialect):
        return name
    left, right = _QUOTES[dialect]
    return f"{left}{name.replace(right, right + right)}{right}"


def _sqlite_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@lru_cache(maxsize=4096)
def _render_type(declared: str, dialect: str) -> str:
    t = declared.strip()
    if not t:
        return "" if dialect == "sqlite" else "TEXT"
    t = _GENERIC_TYPES.get(t.lower(), t)
    if dialect == "sqlite":
        return t
    try:
        from sqlglot import exp

        return exp.DataType.build(t, dialect="sqlite").sql(dialect=_SQLGLOT[dialect])
    except Exception:  # a type sqlglot does not know: show it as declared
        return t


def _says_more(natural: str, name: str) -> bool:
    norm = lambda s: re.sub(r"[\s_]+", "", s).lower()  # noqa: E731
    return bool(natural) and natural != "*" and norm(natural) != norm(name)


def schemas_from_tables_json(entries: Iterable[dict[str, Any]], origin: str = "tables.json"
                             ) -> dict[str, DatabaseSchema]:
    """``{db_id: DatabaseSchema}`` from a parsed ``tables.json`` list; errors name the index."""
    out: dict[str, DatabaseSchema] = {}
    for i, entry in enumerate(entries):
        try:
            schema = DatabaseSchema.from_tables_json(entry)
        except TaskError as exc:
            raise TaskError(f"{origin}[{i}]: {exc}") from None
        out[schema.db_id] = schema
    return out
