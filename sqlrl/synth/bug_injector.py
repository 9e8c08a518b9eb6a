"""The bug injector's machinery: what a mutation is, ``BugInjector`` and the ``BUGS`` registry.

An injector is a function of a ``_Ctx`` (a private copy of the query, its ``SchemaInfo``, a
``random.Random`` and the sqlglot dialect) that returns ``(issue_sql, description, parse_dialect)``
or ``None``; ``_register`` wraps it in a ``BugInjector`` and adds it to ``BUGS``. The injectors
themselves live in ``bug_logic.py`` and ``bug_syntax.py``; ``bugs.py`` imports them (in registry
order) and re-exports every public name here.

Guarantees:
- ``BugInjector.inject`` never modifies ``expr`` (the injector gets a copy); it returns ``None``
  when the injector does not apply, when sqlglot cannot render its result (``SqlglotError``), or
  when the result is empty or equal to the original query's rendering. Any other exception
  propagates.
- ``BUGS`` keeps registration order (``categories()`` lists names in that order): seeded
  generation draws from it, so the order in which the injector modules register is what a seed
  produces.
- ``parse_sql`` accepts exactly one statement, else ``ValueError`` with sqlglot's reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from .bug_schema import SchemaInfo, sqlglot_dialect


@dataclass(frozen=True)
class Mutation:
    name: str  # injector name, e.g. "wrong_aggregate"
    category: str  # bug family, e.g. "wrong_aggregate", "syntax_error"
    issue_sql: str
    description: str  # what was changed (for logs; never shown to the solver)
    symptom: str  # a vague, fix-free hint of what the user would notice
    parse_dialect: str | None  # sqlglot dialect the issue SQL parses in; None = it must not parse


@dataclass
class _Ctx:
    expr: exp.Expression  # a private copy; injectors may mutate it
    schema: SchemaInfo
    rng: random.Random
    dialect: str  # sqlglot dialect name

    def render(self, node: exp.Expression | None = None) -> str:
        return (node or self.expr).sql(dialect=self.dialect)


# (issue_sql, description, parse_dialect)
_Change = tuple[str, str, "str | None"]
_Fn = Callable[[_Ctx], "_Change | None"]


@dataclass(frozen=True)
class BugInjector:
    name: str
    category: str
    fn: _Fn = field(repr=False)
    symptom: str = ""

    def inject(self, expr: exp.Expression, schema_info: SchemaInfo,
               rng: random.Random) -> Mutation | None:
        dialect = sqlglot_dialect(schema_info.dialect)
        original = expr.sql(dialect=dialect)
        try:
            change = self.fn(_Ctx(expr.copy(), schema_info, rng, dialect))
        except SqlglotError:
            return None  # a construct sqlglot cannot re-render: not applicable to this query
        if change is None:
            return None
        sql, description, parse_dialect = change
        if not sql or sql == original:
            return None
        return Mutation(self.name, self.category, sql, description, self.symptom, parse_dialect)


BUGS: dict[str, BugInjector] = {}


def _register(name: str, category: str, symptom: str) -> Callable[[_Fn], _Fn]:
    def deco(fn: _Fn) -> _Fn:
        BUGS[name] = BugInjector(name, category, fn, symptom)
        return fn
    return deco


def categories() -> dict[str, list[str]]:
    """category -> injector names (registry order)."""
    out: dict[str, list[str]] = {}
    for inj in BUGS.values():
        out.setdefault(inj.category, []).append(inj.name)
    return out


def parse_sql(sql: str, dialect: str) -> exp.Expression:
    """Parse one statement in the sqlrl ``dialect``; raises ``ValueError`` with sqlglot's reason."""
    try:
        parsed = sqlglot.parse(sql, read=sqlglot_dialect(dialect))
    except SqlglotError as e:
        raise ValueError(f"cannot parse SQL ({dialect}): {str(e).splitlines()[0]}") from None
    stmts = [p for p in parsed if p is not None]
    if len(stmts) != 1:
        raise ValueError(f"expected exactly one SQL statement, got {len(stmts)}")
    return stmts[0]
