"""What text-to-SQL templates are built from: the draft and condition types, SQL and text helpers,
the context templates see (``Ctx``) and the filter registry (``CONDITION_BUILDERS``, ``make_cond``).

``text2sql.py`` (the generator and public entry point) imports these names back;
``text2sql_templates.py`` builds its templates on them.

Guarantees:
- ``Draft``, ``Cond`` and ``Link`` are frozen dataclasses; ``Draft.cut`` is the LIMIT probe the
  generator's ``verify`` checks for ties.
- ``CONDITION_BUILDERS`` maps a column role (category, measure, date, name, text) to the builder of
  one filter on such a column; its keys' order is the default ``roles`` of ``make_cond``.
- Filter constants come from the database itself (``Ctx.values``: the column's distinct non-NULL
  values in order, cached per ``Ctx``); every random choice is drawn from ``Ctx.rng``, so the same
  RNG state and database give the same filters.
- ``lit`` renders a value as a SQL literal (strings quoted, quotes doubled); ``Ctx.rows`` raises
  ``RuntimeError`` when a helper query fails.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .domains import Column, Domain, ForeignKey, Table
from .phrasing import condition


@dataclass(frozen=True)
class Draft:
    """A candidate task before verification."""

    template: str
    sql: str
    question: str
    constructs: tuple[str, ...]
    evidence: str = ""
    order_matters: bool = False
    cut: tuple[str, int, int] | None = None  # (probe SQL with LIMIT k+1, k, sort column index)


@dataclass(frozen=True)
class Cond:
    sql: str
    phrase: str
    evidence: str = ""


@dataclass(frozen=True)
class Link:
    fk: ForeignKey
    child: Table
    parent: Table
    role: str  # the FK column's phrase: "author", "origin airport"


# --- SQL and text helpers ----------------------------------------------------------------------------

def lit(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


def show(col: Column, value: Any) -> str:
    """How a value appears in a question."""
    meaning = col.meaning(value)
    if meaning is not None:
        return meaning
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{text} {col.unit}" if col.unit and isinstance(value, (int, float)) else text


def encoding(col: Column, value: Any) -> str:
    meaning = col.meaning(value)
    return "" if meaning is None else f"{meaning} refers to {col.name} = {lit(value)}"


def ref(alias: str, column: str) -> str:
    return f"{alias}.{column}" if alias else column


def join_evidence(*parts: str) -> str:
    seen: list[str] = []
    for p in parts:
        if p and p not in seen:
            seen.append(p)
    return "; ".join(seen)


class Ctx:
    """What templates see: the domain, a session on its database, the RNG and cached value lists."""

    def __init__(self, domain: Domain, session: Any, rng: random.Random) -> None:
        self.domain, self.session, self.rng = domain, session, rng
        self._values: dict[tuple[str, str], list[Any]] = {}
        self.links = [Link(fk, domain.table(fk.table), domain.table(fk.ref_table),
                           domain.table(fk.table).column(fk.column).phrase)
                      for fk in domain.foreign_keys]

    def rows(self, sql: str) -> list[tuple]:
        r = self.session.execute(sql)
        if not r.ok:
            raise RuntimeError(f"helper query failed: {r.error} -- {sql}")
        return list(r.rows)

    def values(self, table: str, column: str) -> list[Any]:
        key = (table, column)
        if key not in self._values:
            self._values[key] = [v for (v,) in self.rows(
                f"SELECT DISTINCT {column} FROM {table} WHERE {column} IS NOT NULL ORDER BY {column}")]
        return self._values[key]

    def pick(self, seq: Sequence[Any]) -> Any:
        return self.rng.choice(seq) if seq else None

    def middle(self, values: list[Any]) -> Any:
        """A value between the 20th and 80th percentile (so both sides of it are non-empty)."""
        if len(values) < 3:
            return None
        return values[self.rng.randrange(max(1, len(values) // 5), max(2, 4 * len(values) // 5))]


# --- filters (a registry by column role) -------------------------------------------------------------

def _cond_category(ctx: Ctx, t: Table, col: Column, r: str, phrase: str) -> Cond | None:
    v = ctx.pick(ctx.values(t.name, col.name))
    if v is None:
        return None
    shown = show(col, v)
    return Cond(f"{r} = {lit(v)}", condition("eq", phrase, shown, ctx.rng), encoding(col, v))


def _cond_measure(ctx: Ctx, t: Table, col: Column, r: str, phrase: str) -> Cond | None:
    values = ctx.values(t.name, col.name)
    v = ctx.middle(values)
    if v is None:
        return None
    op = ctx.rng.choice(["gt", "lt", "ge", "le", "between"])
    if op == "between":
        i, j = sorted(ctx.rng.sample(range(len(values)), 2))
        return Cond(f"{r} BETWEEN {lit(values[i])} AND {lit(values[j])}",
                    condition("between", phrase, show(col, values[i]), ctx.rng, show(col, values[j])))
    sym = {"gt": ">", "lt": "<", "ge": ">=", "le": "<="}[op]
    return Cond(f"{r} {sym} {lit(v)}", condition(op, phrase, show(col, v), ctx.rng))


def _cond_date(ctx: Ctx, t: Table, col: Column, r: str, phrase: str) -> Cond | None:
    values = ctx.values(t.name, col.name)
    v = ctx.middle(values)
    if v is None:
        return None
    op = ctx.rng.choice(["before", "after", "between"])
    if op == "between":
        i, j = sorted(ctx.rng.sample(range(len(values)), 2))
        return Cond(f"{r} BETWEEN {lit(values[i])} AND {lit(values[j])}",
                    condition("between", phrase, values[i], ctx.rng, values[j]))
    return Cond(f"{r} {'<' if op == 'before' else '>'} {lit(v)}", condition(op, phrase, v, ctx.rng))


_WORD = re.compile(r"[A-Za-z]{4,}")


def _cond_text(ctx: Ctx, t: Table, col: Column, r: str, phrase: str) -> Cond | None:
    words = sorted({w for v in ctx.values(t.name, col.name) if isinstance(v, str) for w in _WORD.findall(v)})
    w = ctx.pick(words)
    if w is None:
        return None
    return Cond(f"{r} LIKE {lit('%' + w + '%')}", condition("like", phrase, f'"{w}"', ctx.rng))


CONDITION_BUILDERS: dict[str, Callable[[Ctx, Table, Column, str, str], Cond | None]] = {
    "category": _cond_category, "measure": _cond_measure, "date": _cond_date,
    "name": _cond_text, "text": _cond_text,
}

def make_cond(ctx: Ctx, table: Table, alias: str = "", roles: Sequence[str] = tuple(CONDITION_BUILDERS),
              prefix: str = "", allow_null: bool = True) -> Cond | None:
    """One filter on ``table``; ``prefix`` qualifies the column phrase ("author's country")."""
    cols = [c for c in table.columns if c.role in roles]
    col = ctx.pick(cols)
    if col is None:
        return None
    phrase = f"{prefix}{col.phrase}"
    r = ref(alias, col.name)
    if allow_null and col.nullable and ctx.rng.random() < 0.25:
        op = ctx.rng.choice(["null", "notnull"])
        return Cond(f"{r} IS {'NULL' if op == 'null' else 'NOT NULL'}", condition(op, phrase, "", ctx.rng))
    return CONDITION_BUILDERS[col.role](ctx, table, col, r, phrase)
