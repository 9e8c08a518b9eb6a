"""Database schemas as values: tables, columns, primary and foreign keys, and CREATE TABLE text.

The one schema model of sqlrl (``synth.bugs.SchemaInfo`` is an index over it). Three sources: a
Spider/BIRD ``tables.json`` entry (``DatabaseSchema.from_tables_json``), a SQLite file
(``DatabaseSchema.from_sqlite``, read-only through PRAGMAs: declaration order, primary and foreign
keys; schema reading, not query execution -- agent and gold SQL run through ``sqlrl.db`` sessions
only) and any engine through a session (``DatabaseSchema.from_url``: the query is the engine's
``Dialect.columns_sql``, ``sqlrl/db/dialects/engines.py``).

Guarantees:
- ``ColumnSchema`` / ``ForeignKey`` / ``TableSchema`` / ``DatabaseSchema`` are frozen dataclasses
  of str / bool / tuples: hashable, picklable, safe across Ray actor boundaries.
- ``to_create_sql(dialect)`` renders one ``CREATE TABLE`` statement per table (``;``-terminated,
  blank-line separated) in which every identifier that is not a plain word, or that is a reserved
  word, is quoted the dialect's way (quote characters and reserved words: the engine's
  descriptor); for SQLite the output executes on an empty database for every
  Spider and BIRD ``tables.json`` schema (tested). SQLite's internal ``sqlite_*`` tables (Spider
  lists ``sqlite_sequence``) are left out of the schema. Types are shown as declared;
  Spider's generic types (``number``, ``text``, ``time``, ``boolean``, ``others``) are mapped to
  SQL types, and for other dialects types are transpiled by sqlglot when it knows them. Names
  are rendered as the source spells them: a database loaded into PostgreSQL/MariaDB by
  ``sqlrl.db.provisioning.loader`` has lower-cased names, so render its prompt from that database instead.
- Malformed ``tables.json`` entries raise ``TaskError`` naming the database and the field.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from sqlrl.db.dialects.descriptor import Dialect, dialect_of, dialects, find

from .types import TaskError, norm_dialect

_MAX_COLUMNS = 100_000  # introspection reads one row per column

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
        return self._create_sql(_engine(dialect))

    def _create_sql(self, engine: Dialect) -> str:
        q = engine.identifier
        lines = []
        for col in self.columns:
            typ = _render_type(col.type, engine)
            lines.append(" ".join(p for p in (q(col.name), typ, "NOT NULL" if col.not_null else "") if p))
        if self.primary_key:
            lines.append(f"PRIMARY KEY ({', '.join(q(c) for c in self.primary_key)})")
        for fk in self.foreign_keys:
            lines.append(f"FOREIGN KEY ({', '.join(q(c) for c in fk.columns)}) REFERENCES "
                         f"{q(fk.ref_table)} ({', '.join(q(c) for c in fk.ref_columns)})")
        body = ",\n".join("  " + line for line in lines)
        return f"CREATE TABLE {q(self.name)} (\n{body}\n);"

    def to_compact(self, dialect: str = "sqlite") -> str:
        return self._compact(_engine(dialect))

    def _compact(self, engine: Dialect) -> str:
        q = engine.identifier
        refs = {c.lower(): f"{q(fk.ref_table)}.{q(rc)}" for fk in self.foreign_keys
                for c, rc in zip(fk.columns, fk.ref_columns)}
        pk = {c.lower() for c in self.primary_key}
        cols = []
        for col in self.columns:
            typ = _render_type(col.type, engine)
            notes = (["PK"] if col.name.lower() in pk else []) + (
                [f"-> {refs[col.name.lower()]}"] if col.name.lower() in refs else [])
            cols.append(" ".join(p for p in (q(col.name), typ, *notes) if p))
        return f"{q(self.name)}({', '.join(cols)})"


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
        engine = _engine(dialect)
        return "\n\n".join(t._create_sql(engine) for t in self.tables)

    def to_compact(self, dialect: str = "sqlite") -> str:
        """One line per table, in schema order: ``name(col TYPE [PK] [-> table.col], …)`` -- the
        same tables, columns, types and keys as ``to_create_sql`` in about half the tokens
        (identifiers quoted the same way; ``NOT NULL`` left out)."""
        engine = _engine(dialect)
        return "\n".join(t._compact(engine) for t in self.tables)

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

    @classmethod
    def from_url(cls, url: str, db_id: str | None = None, timeout_s: float = 5.0) -> "DatabaseSchema":
        """Introspect a database of any engine through a ``sqlrl.db`` session (on a server: the
        session's own clone) with the engine's ``Dialect.columns_sql``: every table **and view**,
        in name order, with column names, declared types and NOT NULL; no keys. Raises
        ``ValueError`` for an engine without introspection, ``RuntimeError`` when it fails."""
        from sqlrl.db import Limits, open_session
        from sqlrl.db.url import dialect_name, parse_url

        parsed = parse_url(url)
        name = dialect_name(parsed)
        engine = find(name)
        if engine is None or engine.columns_sql is None:
            raise ValueError(f"schema introspection is not implemented for dialect {name!r} "
                             f"(supported: {', '.join(d.name for d in dialects() if d.columns_sql)})")
        limits = Limits(timeout_s=timeout_s, max_rows=_MAX_COLUMNS, max_bytes=64 * 2**20)
        with open_session(url, limits=limits) as session:
            r = session.execute(engine.columns_sql)
        if r.error:
            raise RuntimeError(f"cannot read the schema: {r.error}")
        if r.truncated:
            raise RuntimeError(f"cannot read the schema: more than {_MAX_COLUMNS} columns")
        tables: dict[str, list[ColumnSchema]] = {}
        for table, column, declared, not_null in r.rows:
            tables.setdefault(table, []).append(ColumnSchema(column, declared or "", bool(not_null)))
        if db_id is None:
            db_id = Path(parsed.database or "").stem if engine.file_based else parsed.database or ""
        return cls(db_id, tuple(TableSchema(t, tuple(cols)) for t, cols in tables.items()))


# -- rendering helpers ---------------------------------------------------------------------------

# Spider's generic column types (tables.json) -> a SQL type per dialect family.
_GENERIC_TYPES = {"number": "NUMERIC", "text": "TEXT", "time": "DATETIME", "boolean": "BOOLEAN",
                  "others": "TEXT"}


def quote_identifier(name: str, dialect: str = "sqlite") -> str:
    """``name`` as the dialect writes it: bare when a plain non-keyword word, else quoted with the
    engine's quote characters (``Dialect.identifier``; keywords: ``Dialect.keywords``)."""
    return _engine(dialect).identifier(name)


def _engine(dialect: str) -> Dialect:
    return dialect_of(norm_dialect(dialect))  # TaskError for an unknown name


def _sqlite_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@lru_cache(maxsize=4096)
def _render_type(declared: str, engine: Dialect) -> str:
    """A column type as ``engine`` shows it: as declared where types are free text (SQLite),
    else transpiled by sqlglot (declared types are read as SQLite's)."""
    t = declared.strip()
    if not t:
        return "" if engine.declared_types else "TEXT"
    t = _GENERIC_TYPES.get(t.lower(), t)
    if engine.declared_types:
        return t
    try:
        from sqlglot import exp

        return exp.DataType.build(t, dialect="sqlite").sql(dialect=engine.sqlglot)
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
