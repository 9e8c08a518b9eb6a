"""Realistic SQL bugs, injected into a correct query by AST mutation (sqlglot).

``BUGS`` maps an injector name to a ``BugInjector``; ``injector.inject(expr, schema, rng)``
returns a ``Mutation`` (the buggy SQL and what was changed) or ``None`` when the bug does not apply
to that query. Categories: wrong_column, wrong_table, wrong_join_key, missing_group_by,
off_by_one, wrong_aggregate, distinct, order_by, syntax_error, wrong_dialect, null_comparison,
join_type, missing_join_condition, wrong_logic.

Guarantees:
- ``inject`` never modifies ``expr`` (it works on a copy); an injector that cannot apply (or whose
  result sqlglot cannot render) returns ``None``; a returned ``Mutation.issue_sql`` always differs
  from the rendering of the original query. (Any other exception is a bug and propagates;
  ``critic_gen`` counts it as an ``error`` attempt and goes on. None on Spider dev's 1,034 golds.)
- Deterministic: the same expr, schema and ``random.Random`` state give the same mutation.
- ``Mutation.parse_dialect`` tells how the buggy SQL parses: the sqlglot dialect it parses in
  (the task's own, or for ``wrong_dialect`` the foreign dialect the construct comes from), or
  ``None`` for the syntax-error family, whose SQL sqlglot rejects (except ``syntax_trailing_comma``:
  sqlglot accepts trailing commas, the engines do not — its ``parse_dialect`` is ``None`` too).
- Nothing here runs SQL except ``schema_from_url``, which introspects through a ``sqlrl.db`` session
  (``DatabaseSchema.from_url``). Dialect names are read from the engines' descriptors
  (``sqlrl/db/dialects/engines.py``); ``DIALECT_RULES`` is a catalogue of foreign constructs keyed
  by sqlglot dialect, and an engine without rules simply gets no ``wrong_dialect`` bugs.
  Whether a mutation really changes the result is decided by execution (``critic_gen``).
- The public entry point: every name below is re-exported from the modules that hold it --
  ``bug_schema`` (``SchemaInfo``, ``ColumnInfo``, ``type_class``, ``schema_from_url``,
  ``sqlglot_dialect``), ``bug_injector`` (``Mutation``, ``BugInjector``, ``BUGS``,
  ``categories``, ``parse_sql``) and ``bug_syntax`` (``DialectRule``, ``DIALECT_RULES``); the
  injectors live in ``bug_logic`` and ``bug_syntax``, their shared helpers in ``bug_scope``.
  Importing this module registers the injectors in the one order seeded generation depends on:
  ``bug_logic``'s (schema-level, logic), then ``bug_syntax``'s (syntax errors, wrong dialect).
"""

from __future__ import annotations

import random
from typing import Iterable

from sqlglot import exp

# The registry's order: bug_logic's injectors first, then bug_syntax's (module doc).
from . import bug_logic  # noqa: F401
from .bug_injector import BUGS, BugInjector, Mutation, categories, parse_sql
from .bug_schema import ColumnInfo, SchemaInfo, schema_from_url, sqlglot_dialect, type_class
from .bug_syntax import DIALECT_RULES, DialectRule

__all__ = ["BUGS", "BugInjector", "ColumnInfo", "DIALECT_RULES", "DialectRule", "Mutation",
           "SchemaInfo", "applicable", "categories", "parse_sql", "schema_from_url",
           "sqlglot_dialect", "type_class"]


def applicable(expr: exp.Expression, schema: SchemaInfo, rng: random.Random,
               names: Iterable[str] | None = None) -> dict[str, Mutation]:
    """Every named injector's mutation of ``expr`` (those that apply), for inspection/tests."""
    out = {}
    for name in names or BUGS:
        m = BUGS[name].inject(expr, schema, rng)
        if m is not None:
            out[name] = m
    return out
