"""Bug injectors whose query still runs: schema-level and logic mistakes (the result is wrong).

Registered in this order: wrong_column, wrong_table, wrong_join_key (schema-level), then
missing_group_by, off_by_one, wrong_aggregate, distinct_drop, distinct_add, order_direction,
order_column, null_comparison, join_type, missing_join_condition, wrong_logic. Each works on an
AST copy (``bug_injector._Ctx``) and returns SQL that parses in the task's own dialect.

Guarantees:
- Importing this module registers these 14 injectors into ``bug_injector.BUGS``, in the order
  above, once; ``bugs.py`` imports it before ``bug_syntax`` so the registry's order (what a seed
  produces) is the one it always was.
- Every returned mutation's ``parse_dialect`` is the task's sqlglot dialect; an injector that
  finds nothing to change returns ``None``.
- Whether a mutation really changes the result is decided by execution (``critic_gen``), not here.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

import sqlglot
from sqlglot import exp

from .bug_injector import _Change, _Ctx, _register
from .bug_schema import type_class
from .bug_scope import _columns, _in_join_condition, _pick, _resolve, _set_column_name, _top_select


# ----------------------------------------------------------------------------------------------
# Injectors: schema-level mistakes


@_register("wrong_column", "wrong_column", "Some values in the result do not look right.")
def _wrong_column(ctx: _Ctx) -> _Change | None:
    options = []
    for col in _columns(ctx.expr):
        if _in_join_condition(col):
            continue
        table, sibs = _same_type_siblings(col, ctx)
        if sibs:
            options.append((col, table, sibs))
    choice = _pick(ctx.rng, options)
    if choice is None:
        return None
    col, table, sibs = choice
    new = _pick(ctx.rng, sibs)
    old = col.name
    _set_column_name(col, new)
    return ctx.render(), f"column {table}.{old} replaced by sibling {table}.{new}", ctx.dialect


@_register("wrong_table", "wrong_table", "The rows I get do not seem to come from the right data.")
def _wrong_table(ctx: _Ctx) -> _Change | None:
    options = []
    for t in ctx.expr.find_all(exp.Table):
        real = ctx.schema.table(t.name) if t.name else None
        if real is None:
            continue
        ref = t.alias_or_name.lower()
        used = {c.name.lower() for c in _columns(ctx.expr)
                if (c.table and c.table.lower() == ref)
                or (not c.table and _resolve(c, ctx) == real)}
        others = [o for o in ctx.schema.tables if o.lower() != real.lower()]
        full = [o for o in others if used <= {c.name.lower() for c in ctx.schema.columns(o)}]
        some = [o for o in others if used & {c.name.lower() for c in ctx.schema.columns(o)}]
        cands = full or some
        if cands:
            options.append((t, real, cands))
    choice = _pick(ctx.rng, options)
    if choice is None:
        return None
    t, real, cands = choice
    new = _pick(ctx.rng, cands)
    if not t.alias:  # qualifiers spelled with the table name follow the rename
        for c in _columns(ctx.expr):
            if c.table and c.table.lower() == real.lower():
                c.set("table", exp.to_identifier(new))
    t.set("this", exp.to_identifier(new, quoted=not re.fullmatch(r"[A-Za-z_]\w*", new)))
    return ctx.render(), f"table {real} replaced by {new}", ctx.dialect


def _key_like(name: str) -> bool:
    n = name.lower()
    return n == "id" or n.endswith("id") or n.endswith("_id") or n.endswith("code") or n.endswith("no")


@_register("wrong_join_key", "wrong_join_key", "The join seems to match the wrong rows.")
def _wrong_join_key(ctx: _Ctx) -> _Change | None:
    options = []
    for j in ctx.expr.find_all(exp.Join):
        on = j.args.get("on")
        if on is None:
            continue
        for eq in on.find_all(exp.EQ):
            for side in (eq.this, eq.expression):
                if not isinstance(side, exp.Column):
                    continue
                table, sibs = _same_type_siblings(side, ctx)
                keys = [s for s in sibs if _key_like(s)]
                if sibs:
                    options.append((side, table, keys or sibs))
    return _rename_one(ctx, options, "join key")


def _same_type_siblings(col: exp.Column, ctx: _Ctx) -> tuple[str | None, list[str]]:
    """The table ``col`` belongs to and that table's other columns of the same type class."""
    table = _resolve(col, ctx)
    info = ctx.schema.column(table, col.name) if table else None
    if info is None:
        return table, []
    cls = type_class(info.type)
    return table, [c.name for c in ctx.schema.columns(table)
                   if c.name.lower() != col.name.lower() and type_class(c.type) == cls]


def _rename_one(ctx: _Ctx, options: list, what: str) -> _Change | None:
    """Pick one ``(column node, table, candidate names)`` option and rename that column to one of
    its candidates."""
    choice = _pick(ctx.rng, options)
    if choice is None:
        return None
    col, table, cands = choice
    old, new = col.name, _pick(ctx.rng, cands)
    _set_column_name(col, new)
    return ctx.render(), f"{what} {table}.{old} replaced by {table}.{new}", ctx.dialect


# ----------------------------------------------------------------------------------------------
# Injectors: logic mistakes


@_register("missing_group_by", "missing_group_by", "The grouping of the result looks wrong.")
def _missing_group_by(ctx: _Ctx) -> _Change | None:
    options = [s for s in ctx.expr.find_all(exp.Select) if s.args.get("group")
               and s.args["group"].expressions]
    sel = _pick(ctx.rng, options)
    if sel is None:
        return None
    group = sel.args["group"]
    keys = list(group.expressions)
    if len(keys) == 1:
        sel.set("group", None)
        return ctx.render(), f"GROUP BY {keys[0].sql(dialect=ctx.dialect)} removed", ctx.dialect
    selected = {e.unalias().sql(dialect=ctx.dialect) for e in sel.expressions}
    in_select = [k for k in keys if k.sql(dialect=ctx.dialect) in selected]
    drop = _pick(ctx.rng, in_select or keys)
    text = drop.sql(dialect=ctx.dialect)
    group.set("expressions", [k for k in keys if k is not drop])
    return ctx.render(), f"GROUP BY key {text} dropped", ctx.dialect


_FLIP = {exp.GT: exp.GTE, exp.GTE: exp.GT, exp.LT: exp.LTE, exp.LTE: exp.LT}
_OP = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.EQ: "=", exp.NEQ: "<>"}


def _shift(lit: exp.Literal, delta: int) -> exp.Literal | None:
    try:
        v = int(lit.this)
    except ValueError:
        try:
            v = float(lit.this)  # type: ignore[assignment]
        except ValueError:
            return None
    return exp.Literal.number(v + delta)


@_register("off_by_one", "off_by_one", "Some rows are missing or there are rows that should not be there.")
def _off_by_one(ctx: _Ctx) -> _Change | None:
    options: list[tuple[str, exp.Expression]] = []
    for node in ctx.expr.find_all(exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between):
        if type(node) in _FLIP:
            options.append(("flip", node))
        if not isinstance(node, exp.EQ) and any(isinstance(a, exp.Literal) and a.is_number
                                                for a in node.args.values()):
            options.append(("shift", node))
    choice = _pick(ctx.rng, options)
    if choice is None:
        return None
    kind, node = choice
    before = node.sql(dialect=ctx.dialect)
    if kind == "flip":
        node.replace(_FLIP[type(node)](this=node.this.copy(), expression=node.expression.copy()))
        return ctx.render(), f"comparison {_OP[type(node)]} changed to {_OP[_FLIP[type(node)]]} " \
                             f"in {before}", ctx.dialect
    lits = [(k, a) for k, a in node.args.items() if isinstance(a, exp.Literal) and a.is_number]
    key, lit = _pick(ctx.rng, lits)
    new = _shift(lit, _pick(ctx.rng, [-1, 1]))
    if new is None:
        return None
    node.set(key, new)
    return ctx.render(), f"boundary constant {lit.this} changed to {new.this} in {before}", ctx.dialect


def _aggregate_swaps(node: exp.Expression) -> list[tuple[str, Callable[[], exp.Expression]]]:
    this = node.this
    if isinstance(node, exp.Count):
        if isinstance(this, exp.Star) or this is None:
            return []
        if isinstance(this, exp.Distinct):
            inner = this.expressions[0] if len(this.expressions) == 1 else None
            if inner is None:
                return []
            return [("COUNT(DISTINCT x) -> COUNT(x)", lambda: exp.Count(this=inner.copy()))]
        return [("COUNT(x) -> SUM(x)", lambda: exp.Sum(this=this.copy())),
                ("COUNT(x) -> COUNT(DISTINCT x)",
                 lambda: exp.Count(this=exp.Distinct(expressions=[this.copy()])))]
    if isinstance(this, exp.Distinct):
        return []
    table = {exp.Sum: [("SUM -> COUNT", exp.Count), ("SUM -> AVG", exp.Avg)],
             exp.Avg: [("AVG -> SUM", exp.Sum)],
             exp.Max: [("MAX -> MIN", exp.Min)], exp.Min: [("MIN -> MAX", exp.Max)]}
    return [(d, (lambda cls=cls: cls(this=this.copy()))) for d, cls in table.get(type(node), [])]


@_register("wrong_aggregate", "wrong_aggregate", "The numbers in the result look off.")
def _wrong_aggregate(ctx: _Ctx) -> _Change | None:
    options = []
    for node in ctx.expr.find_all(exp.Count, exp.Sum, exp.Avg, exp.Max, exp.Min):
        for desc, make in _aggregate_swaps(node):
            options.append((node, desc, make))
    choice = _pick(ctx.rng, options)
    if choice is None:
        return None
    node, desc, make = choice
    before = node.sql(dialect=ctx.dialect)
    node.replace(make())
    return ctx.render(), f"aggregate {desc} in {before}", ctx.dialect


@_register("distinct_drop", "distinct", "The result has duplicate rows.")
def _distinct_drop(ctx: _Ctx) -> _Change | None:
    sel = _pick(ctx.rng, [s for s in ctx.expr.find_all(exp.Select) if s.args.get("distinct")])
    if sel is None:
        return None
    sel.set("distinct", None)
    return ctx.render(), "DISTINCT removed", ctx.dialect


@_register("distinct_add", "distinct", "Some rows I expect seem to be missing.")
def _distinct_add(ctx: _Ctx) -> _Change | None:
    sel = _top_select(ctx.expr)
    if sel is None or sel.args.get("distinct") or sel.args.get("group"):
        return None
    if any(isinstance(e.unalias(), exp.AggFunc) for e in sel.expressions):
        return None  # a plain aggregate returns one row: DISTINCT cannot change it
    sel.set("distinct", exp.Distinct())
    return ctx.render(), "DISTINCT added", ctx.dialect


@lru_cache(maxsize=None)
def _default_nulls_first(dialect: str, desc: bool) -> bool:
    """Where the dialect puts NULLs by default (so a flipped key renders without NULLS FIRST/LAST)."""
    sel = sqlglot.parse_one(f"SELECT x FROM t ORDER BY x {'DESC' if desc else 'ASC'}", read=dialect)
    return bool(sel.find(exp.Ordered).args.get("nulls_first"))


@_register("order_direction", "order_by", "The rows come back in the wrong order.")
def _order_direction(ctx: _Ctx) -> _Change | None:
    orders = [o for o in ctx.expr.find_all(exp.Ordered)]
    o = _pick(ctx.rng, orders)
    if o is None:
        return None
    desc = bool(o.args.get("desc"))
    o.set("desc", not desc)
    o.set("nulls_first", _default_nulls_first(ctx.dialect, not desc))
    return ctx.render(), f"sort direction of {o.this.sql(dialect=ctx.dialect)} flipped to " \
                         f"{'ASC' if desc else 'DESC'}", ctx.dialect


@_register("order_column", "order_by", "The rows are not sorted the way I want.")
def _order_column(ctx: _Ctx) -> _Change | None:
    options = []
    for o in ctx.expr.find_all(exp.Ordered):
        if isinstance(o.this, exp.Column):
            table = _resolve(o.this, ctx)
            if table:
                sibs = [c.name for c in ctx.schema.columns(table)
                        if c.name.lower() != o.this.name.lower()]
                if sibs:
                    options.append((o.this, table, sibs))
    return _rename_one(ctx, options, "sort column")


@_register("null_comparison", "null_comparison", "The filter on empty values does not seem to work.")
def _null_comparison(ctx: _Ctx) -> _Change | None:
    options = [n for n in ctx.expr.find_all(exp.Is) if isinstance(n.expression, exp.Null)]
    node = _pick(ctx.rng, options)
    if node is None:
        return None
    if isinstance(node.parent, exp.Not):
        node.parent.replace(exp.NEQ(this=node.this.copy(), expression=exp.Null()))
        return ctx.render(), "IS NOT NULL written as <> NULL", ctx.dialect
    node.replace(exp.EQ(this=node.this.copy(), expression=exp.Null()))
    return ctx.render(), "IS NULL written as = NULL", ctx.dialect


@_register("join_type", "join_type", "Some rows are missing or extra rows appear.")
def _join_type(ctx: _Ctx) -> _Change | None:
    options = [j for j in ctx.expr.find_all(exp.Join)
               if j.args.get("on") is not None and not j.args.get("kind")
               and (j.args.get("side") or "").upper() in ("", "LEFT")]
    j = _pick(ctx.rng, options)
    if j is None:
        return None
    if (j.args.get("side") or "").upper() == "LEFT":
        j.set("side", None)
        return ctx.render(), "LEFT JOIN changed to INNER JOIN", ctx.dialect
    j.set("side", "LEFT")
    return ctx.render(), "INNER JOIN changed to LEFT JOIN", ctx.dialect


@_register("missing_join_condition", "missing_join_condition",
           "The result looks inflated.")
def _missing_join_condition(ctx: _Ctx) -> _Change | None:
    j = _pick(ctx.rng, [j for j in ctx.expr.find_all(exp.Join) if j.args.get("on") is not None])
    if j is None:
        return None
    cond = j.args["on"].sql(dialect=ctx.dialect)
    j.set("on", None)
    return ctx.render(), f"join condition ON {cond} removed", ctx.dialect


@_register("wrong_logic", "wrong_logic", "The filter does not keep the rows I want.")
def _wrong_logic(ctx: _Ctx) -> _Change | None:
    nodes = [n for n in ctx.expr.find_all(exp.And, exp.Or) if n.find_ancestor(exp.Where, exp.Having)
             and not _in_join_condition(n)]
    n = _pick(ctx.rng, nodes)
    if n is None:
        return None
    new_cls = exp.Or if isinstance(n, exp.And) else exp.And
    n.replace(new_cls(this=n.this.copy(), expression=n.expression.copy()))
    return ctx.render(), f"{'AND' if new_cls is exp.Or else 'OR'} changed to " \
                         f"{'OR' if new_cls is exp.Or else 'AND'}", ctx.dialect
