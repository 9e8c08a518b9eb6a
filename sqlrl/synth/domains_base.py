"""Types of the domain annotations and the generic database builder (re-exported by ``domains``).

Guarantees: see ``sqlrl.synth.domains``; this module holds no domain data.
"""

from __future__ import annotations

import os
import random
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Callable

# Column roles: what a question template may do with a column.
ROLES = ("id", "fk", "name", "category", "measure", "date", "text")


@dataclass(frozen=True)
class Column:
    name: str
    phrase: str  # how a question names it: "date of birth"
    role: str  # one of ROLES
    sql_type: str = "TEXT"
    nullable: bool = False
    codes: tuple[tuple[Any, str], ...] = ()  # stored value -> meaning ("evidence" for questions)
    unit: str = ""  # "dollars", "minutes": appended to measures in questions
    summable: bool = True  # False for measures a SUM makes no sense of (years, ranks)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"column {self.name!r}: role {self.role!r} is not one of {', '.join(ROLES)}")

    def meaning(self, value: Any) -> str | None:
        for code, text in self.codes:
            if code == value:
                return text
        return None


@dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    label: str = ""  # the column that names a row ("title"); default: first "name" column, else the key

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        for key in self.primary_key:
            if key not in names:
                raise ValueError(f"table {self.name!r}: primary key column {key!r} is not a column")
        if not self.label:
            named = [c.name for c in self.columns if c.role == "name"]
            object.__setattr__(self, "label", named[0] if named else self.primary_key[0])

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    def by_role(self, *roles: str) -> list[Column]:
        return [c for c in self.columns if c.role in roles]


@dataclass(frozen=True)
class ForeignKey:
    table: str  # child table
    column: str
    ref_table: str  # parent table
    ref_column: str


Builder = Callable[[str, int, float], None]


@dataclass(frozen=True)
class Domain:
    name: str
    description: str
    tables: tuple[Table, ...]
    foreign_keys: tuple[ForeignKey, ...]
    populate: Callable[[random.Random, float], dict[str, list[tuple]]] | None = None
    builder: Builder | None = field(default=None, compare=False)  # overrides DDL + populate

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"domain {self.name!r} has no table {name!r}")

    def ddl(self) -> str:
        """CREATE TABLE statements generated from the annotations."""
        out = []
        for t in self.tables:
            lines = [f"    {c.name} {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in t.columns]
            lines.append(f"    PRIMARY KEY ({', '.join(t.primary_key)})")
            for fk in self.foreign_keys:
                if fk.table == t.name:
                    lines.append(f"    FOREIGN KEY ({fk.column}) REFERENCES {fk.ref_table}({fk.ref_column})")
            out.append(f"CREATE TABLE {t.name} (\n" + ",\n".join(lines) + "\n);")
        return "\n".join(out)


def build_domain_db(domain: Domain, path: str, seed: int = 0, scale: float = 1.0) -> str:
    """Write ``domain``'s database to ``path`` (replacing it) and return ``path``."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if domain.builder is not None:
        domain.builder(path, seed, scale)
        return path
    if domain.populate is None:
        raise ValueError(f"domain {domain.name!r} has neither a builder nor a populate function")
    rows = domain.populate(random.Random(f"{domain.name}:{seed}"), scale)
    if os.path.exists(path):
        os.remove(path)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(domain.ddl())
        for t in domain.tables:
            marks = ", ".join("?" * len(t.columns))
            conn.executemany(f"INSERT INTO {t.name} VALUES ({marks})", rows.get(t.name, []))
        conn.commit()
    finally:
        conn.close()
    return path


def scaled(n: int, scale: float) -> int:
    return max(3, int(round(n * scale)))

