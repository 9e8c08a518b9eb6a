"""Near-miss neighbours of a gold query, for test-suite distillation (``sqlrl.suites.test_suite``).

- ``neighbours(gold_sql, dialect, schema)``: the bug injector's mutations (``sqlrl.synth.bugs``;
  the syntax-error and wrong-dialect families excluded: they only ever error) plus generic ones
  written with sqlglot -- each WHERE/HAVING dropped and each of its conjuncts dropped, each
  comparison flipped (``>``↔``>=``, ``>``↔``<``, ``=``↔``<>``), DISTINCT added or removed,
  LIMIT removed / added / moved by one. Distinct texts, gold excluded, at most
  ``max_neighbours``, deterministic; text sqlglot cannot parse has none. A gold of several
  statements (a program whose last statement's rows are compared, as BIRD-CRITIC's default test
  case after ``preprocess_sql``): the neighbours of its last statement, each after the earlier
  statements unchanged (``"\n;\n"``-joined, ``PROGRAM_SEPARATOR``).
- ``literals(sql)``: the constants of a query (of every statement of a program); the fuzzer mixes
  them into variants' pools.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import sqlglot
from sqlglot import exp

_SKIPPED_FAMILIES = ("syntax_error", "wrong_dialect")
PROGRAM_SEPARATOR = "\n;\n"  # joins a program's statements (a comment cannot swallow the ';')


def join_program(statements: Any) -> str:
    """One SQL text running ``statements`` in order (each stripped of its own trailing ';')."""
    return PROGRAM_SEPARATOR.join(s.strip().rstrip(";").strip() for s in statements if s.strip())


def _statements(sql: str, dialect: str) -> list[str]:
    from sqlrl.db.statements import split_statements
    from sqlrl.synth.bugs import sqlglot_dialect

    try:
        return split_statements(sql, sqlglot_dialect(dialect))
    except Exception:  # text the splitter cannot read: treated as one statement
        return [sql]

_FLIPS: dict[type, tuple[type, ...]] = {
    exp.GT: (exp.GTE, exp.LT), exp.GTE: (exp.GT, exp.LTE), exp.LT: (exp.LTE, exp.GT),
    exp.LTE: (exp.LT, exp.GTE), exp.EQ: (exp.NEQ,), exp.NEQ: (exp.EQ,)}


def _variants_of(tree: exp.Expression, dialect: str) -> list[str]:
    """Generic near misses of ``tree`` (module doc), rendered in ``dialect`` (sqlglot's name)."""
    out: list[str] = []

    def each(cls: type | tuple[type, ...], change: Callable[[exp.Expression], Any]) -> None:
        for k, _ in enumerate(list(tree.find_all(cls))):
            copy = tree.copy()
            node = list(copy.find_all(cls))[k]
            if change(node) is not False:
                out.append(copy.sql(dialect=dialect))

    def drop_conjuncts(clause: exp.Expression) -> None:
        cond = clause.this
        parts = list(cond.flatten()) if isinstance(cond, exp.And) else []
        for i in range(len(parts)):
            copy = tree.copy()
            target = [c for c in copy.find_all(type(clause)) if c.sql() == clause.sql()][0]
            kept = [p.copy() for j, p in enumerate(parts) if j != i]
            target.set("this", exp.and_(*kept) if len(kept) > 1 else kept[0])
            out.append(copy.sql(dialect=dialect))

    for clause_type in (exp.Where, exp.Having):
        for clause in list(tree.find_all(clause_type)):
            drop_conjuncts(clause)
        each(clause_type, lambda n: n.pop())
    for op, targets in _FLIPS.items():
        for target in targets:
            each(op, lambda n, t=target: n.replace(t(this=n.this.copy(), expression=n.expression.copy())))
    each(exp.Select, lambda n: n.set("distinct", None if n.args.get("distinct") else exp.Distinct()))
    each(exp.Limit, lambda n: n.pop())

    def limit_plus(n: exp.Expression) -> Any:
        value = n.expression
        if not (isinstance(value, exp.Literal) and value.is_int):
            return False
        n.set("expression", exp.Literal.number(int(value.this) + 1))

    each(exp.Limit, limit_plus)
    if isinstance(tree, exp.Select) and tree.args.get("limit") is None:
        out.append(tree.copy().limit(1).sql(dialect=dialect))
    return out


def neighbours(gold_sql: str, dialect: str = "sqlite", schema: Any = None, *,
               max_neighbours: int = 48, seeds: int = 3) -> list[str]:
    """Near-miss neighbours of ``gold_sql`` (module doc); ``schema``: a ``bugs.SchemaInfo`` (the
    bug injector needs it; without one only the generic neighbours are made). Text sqlglot cannot
    parse has no neighbours; a program's are its last statement's, after the others (module doc)."""
    from sqlrl.synth.bugs import BUGS, parse_sql, sqlglot_dialect

    statements = _statements(gold_sql, dialect)
    if len(statements) > 1:
        prefix = join_program(statements[:-1]) + PROGRAM_SEPARATOR
        return [prefix + n for n in neighbours(statements[-1], dialect, schema,
                                               max_neighbours=max_neighbours, seeds=seeds)]
    try:
        tree = parse_sql(gold_sql, dialect)
    except ValueError:
        return []
    glot = sqlglot_dialect(dialect)
    found: list[str] = []
    try:
        found += _variants_of(tree, glot)
    except sqlglot.errors.SqlglotError:
        pass
    if schema is not None:
        for seed in range(seeds):
            rng = random.Random(f"neighbours:{seed}")
            for inj in BUGS.values():
                if inj.category in _SKIPPED_FAMILIES:
                    continue
                m = inj.inject(tree, schema, rng)
                if m is not None and m.parse_dialect is not None:
                    found.append(m.issue_sql)
    original = {gold_sql.strip(), tree.sql(dialect=glot)}
    out = [s for s in dict.fromkeys(found) if s.strip() not in original]
    return out[:max_neighbours]


def literals(sql: str, dialect: str = "sqlite") -> tuple[Any, ...]:
    """The constants of ``sql`` (numbers as int/float, strings as str; of every statement of a
    program), deduplicated, in a fixed order; () for text sqlglot cannot parse."""
    from sqlrl.synth.bugs import parse_sql

    statements = _statements(sql, dialect)
    if len(statements) > 1:
        return tuple(dict.fromkeys(v for s in statements for v in literals(s, dialect)))

    try:
        tree = parse_sql(sql, dialect)
    except ValueError:
        return ()
    out: list[Any] = []
    for lit in tree.find_all(exp.Literal):
        if lit.is_string:
            out.append(lit.this)
        else:
            try:
                out.append(int(lit.this))
            except ValueError:
                try:
                    out.append(float(lit.this))
                except ValueError:
                    continue
    return tuple(dict.fromkeys(out))
