"""Schema information for the bug injectors (``bugs.py``): an index over the one schema model.

``SchemaInfo`` maps tables (and views) to their ``ColumnSchema`` columns for one database in one
dialect, with the case-insensitive lookups the injectors need; ``type_class`` is the coarse type
family a *compatible* sibling column is picked by; ``schema_from_url`` reads a live database;
``sqlglot_dialect`` names a sqlrl dialect in sqlglot. ``bugs.py`` re-exports every name.

Guarantees:
- ``SchemaInfo`` validates its dialect through the engines' descriptors (``ValueError`` if unknown)
  and stores the descriptor's name; lookups of tables and columns ignore case; an unknown table
  has no columns.
- Nothing here runs SQL except ``schema_from_url``, which introspects through a ``sqlrl.db``
  session (``DatabaseSchema.from_url``; ``ValueError`` for an engine without introspection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlrl.db.dialects.descriptor import dialect_of

from ..tasks.schema import ColumnSchema, DatabaseSchema


def sqlglot_dialect(dialect: str) -> str:
    """sqlglot's name for the sqlrl ``dialect`` (its descriptor's); ``ValueError`` if unknown."""
    return dialect_of(dialect).sqlglot

# ----------------------------------------------------------------------------------------------
# Schema information: an index over the one schema model (``sqlrl.tasks.schema``)

ColumnInfo = ColumnSchema  # the name injectors and tests use for a column (name, declared type)


def type_class(declared: str) -> str:
    """Coarse type family used to pick a *compatible* sibling column: number/text/time/any."""
    t = (declared or "").upper()
    if not t:
        return "any"
    if any(k in t for k in ("DATE", "TIME", "YEAR")):
        return "time"
    if any(k in t for k in ("INT", "REAL", "FLOA", "DOUB", "NUM", "DEC", "BOOL", "BIT")):
        return "number"
    if any(k in t for k in ("CHAR", "TEXT", "CLOB", "STRING")):
        return "text"
    return "any"


@dataclass(frozen=True)
class SchemaInfo:
    """Tables (and views) -> their ``ColumnSchema`` columns, for one database in one dialect: the
    case-insensitive lookups the injectors need, over a ``DatabaseSchema``'s tables."""

    tables: dict[str, tuple[ColumnSchema, ...]] = field(hash=False)
    dialect: str = "sqlite"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dialect", dialect_of(self.dialect).name)  # validates
        lowered = {name.lower(): name for name in self.tables}
        object.__setattr__(self, "_lower", lowered)

    def table(self, name: str) -> str | None:
        """The table's spelling in the schema (case-insensitive lookup), or None."""
        return self._lower.get(name.lower())  # type: ignore[attr-defined]

    def columns(self, table: str) -> tuple[ColumnSchema, ...]:
        real = self.table(table)
        return self.tables[real] if real else ()

    def column(self, table: str, column: str) -> ColumnSchema | None:
        for c in self.columns(table):
            if c.name.lower() == column.lower():
                return c
        return None

    @classmethod
    def from_mapping(cls, tables: dict[str, Any], dialect: str = "sqlite") -> "SchemaInfo":
        """``{"t": {"a": "INTEGER", ...}}`` or ``{"t": ["a", "b"]}`` -> SchemaInfo."""
        out: dict[str, tuple[ColumnSchema, ...]] = {}
        for t, cols in tables.items():
            if isinstance(cols, dict):
                out[t] = tuple(ColumnSchema(c, str(ty or "")) for c, ty in cols.items())
            else:
                out[t] = tuple(ColumnSchema(str(c)) for c in cols)
        return cls(out, dialect)

    @classmethod
    def from_database_schema(cls, schema: DatabaseSchema, dialect: str = "sqlite") -> "SchemaInfo":
        """The index of a ``DatabaseSchema`` (tables.json, a SQLite file, or ``from_url``)."""
        return cls({t.name: t.columns for t in schema.tables}, dialect)


def schema_from_url(url: str, timeout_s: float = 5.0) -> SchemaInfo:
    """Introspect a database through a ``sqlrl.db`` session (``DatabaseSchema.from_url``: tables
    and views, in name order); ``ValueError`` for an engine without introspection."""
    from sqlrl.db.url import dialect_name, parse_url

    schema = DatabaseSchema.from_url(url, timeout_s=timeout_s)
    return SchemaInfo.from_database_schema(schema, dialect_name(parse_url(url)))
