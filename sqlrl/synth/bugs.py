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
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

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


# ----------------------------------------------------------------------------------------------
# Mutations and the injector machinery


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


# ----------------------------------------------------------------------------------------------
# Helpers


def _alias_map(root: exp.Expression) -> dict[str, str]:
    """alias (or bare table name), lower-cased -> table name, over every table in the query."""
    out: dict[str, str] = {}
    for t in root.find_all(exp.Table):
        if t.name:
            out[t.alias_or_name.lower()] = t.name
    return out


def _scope_tables(node: exp.Expression) -> list[exp.Table]:
    sel = node.find_ancestor(exp.Select)
    if sel is None:
        return []
    out = []
    frm = sel.args.get("from_")
    sources = ([frm.this] if frm is not None else []) + [j.this for j in sel.args.get("joins") or []]
    for s in sources:
        if isinstance(s, exp.Table):
            out.append(s)
    return out


def _resolve(col: exp.Column, ctx: _Ctx) -> str | None:
    """The schema table a column belongs to, or None when unknown/ambiguous."""
    if col.table:
        table = _alias_map(ctx.expr).get(col.table.lower())
        if table and ctx.schema.column(table, col.name):
            return ctx.schema.table(table)
        return None
    owners = {ctx.schema.table(t.name) for t in _scope_tables(col)
              if ctx.schema.column(t.name, col.name)}
    owners.discard(None)
    return owners.pop() if len(owners) == 1 else None


def _set_column_name(col: exp.Column, name: str) -> None:
    ident = col.this
    quoted = isinstance(ident, exp.Identifier) and ident.quoted
    col.set("this", exp.to_identifier(name, quoted=quoted or not re.fullmatch(r"[A-Za-z_]\w*", name)))


def _columns(root: exp.Expression) -> list[exp.Column]:
    return [c for c in root.find_all(exp.Column) if isinstance(c.this, exp.Identifier)]


def _in_join_condition(node: exp.Expression) -> bool:
    p = node.parent
    while p is not None:
        if isinstance(p, exp.Join):
            return True
        if isinstance(p, (exp.Select, exp.Subquery)):
            return False
        p = p.parent
    return False


def _splice(ctx: _Ctx, texts: dict[int, tuple[exp.Expression, str]]) -> str:
    """Render the query with some nodes replaced by raw text (constructs the dialect lacks)."""
    marks = {}
    for i, (node, text) in texts.items():
        mark = f"sqlrl_bug_mark_{i}_"
        node.replace(exp.column(mark))
        marks[mark] = text
    sql = ctx.render()
    for mark, text in marks.items():
        sql = sql.replace(mark, text)
    return sql


def _pick(rng: random.Random, items: list[Any]) -> Any:
    return items[rng.randrange(len(items))] if items else None


def _top_select(root: exp.Expression) -> exp.Select | None:
    return root if isinstance(root, exp.Select) else None


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


# ----------------------------------------------------------------------------------------------
# Injectors: syntax errors (text-level edits of the rendered query, gated on sqlglot rejecting it)


def _rejected(sql: str, dialect: str) -> bool:
    try:
        sqlglot.parse_one(sql, read=dialect)
    except SqlglotError:
        return True
    return False


def _tokens(sql: str, dialect: str) -> list[Any]:
    return list(Dialect.get_or_raise(dialect).tokenize(sql))


def _first_rejected(ctx: _Ctx, candidates: list[tuple[str, str]]) -> _Change | None:
    ctx.rng.shuffle(candidates)
    for sql, desc in candidates:
        if _rejected(sql, ctx.dialect):
            return sql, desc, None
    return None


@_register("syntax_missing_comma", "syntax_error", "The query does not run at all.")
def _missing_comma(ctx: _Ctx) -> _Change | None:
    sql = ctx.render()
    toks = _tokens(sql, ctx.dialect)
    cands = [(sql[:t.start] + sql[t.end + 1:], f"comma at offset {t.start} removed")
             for t in toks if t.token_type == TokenType.COMMA]
    return _first_rejected(ctx, cands)


_MISSPELL = {TokenType.SELECT: ["SELCT", "SLECT"], TokenType.FROM: ["FORM", "FRM"],
             TokenType.WHERE: ["WHRE", "WEHRE"], TokenType.GROUP_BY: ["GRUOP BY", "GROUP BT"],
             TokenType.ORDER_BY: ["ODER BY", "ORDERBY"], TokenType.JOIN: ["JION"],
             TokenType.HAVING: ["HAVNG"], TokenType.LIMIT: ["LIMT"], TokenType.ON: ["OM"]}


@_register("syntax_misspelled_keyword", "syntax_error", "The query does not run at all.")
def _misspelled_keyword(ctx: _Ctx) -> _Change | None:
    sql = ctx.render()
    cands = []
    for t in _tokens(sql, ctx.dialect):
        for wrong in _MISSPELL.get(t.token_type, []):
            cands.append((sql[:t.start] + wrong + sql[t.end + 1:],
                          f"keyword {sql[t.start:t.end + 1]} misspelled as {wrong}"))
    return _first_rejected(ctx, cands)


@_register("syntax_unbalanced_paren", "syntax_error", "The query does not run at all.")
def _unbalanced_paren(ctx: _Ctx) -> _Change | None:
    sql = ctx.render()
    toks = _tokens(sql, ctx.dialect)
    cands = [(sql[:t.start] + sql[t.end + 1:], f"closing parenthesis at offset {t.start} removed")
             for t in toks if t.token_type == TokenType.R_PAREN]
    cands += [(sql[:t.start] + sql[t.end + 1:], f"opening parenthesis at offset {t.start} removed")
              for t in toks if t.token_type == TokenType.L_PAREN]
    return _first_rejected(ctx, cands)


@_register("syntax_trailing_comma", "syntax_error", "The query does not run at all.")
def _trailing_comma(ctx: _Ctx) -> _Change | None:
    """A comma before FROM/WHERE/.../``)`` or at the end. sqlglot tolerates these; no engine
    sqlrl runs does, so this one is not gated on sqlglot (``critic_gen`` verifies by execution)."""
    sql = ctx.render()
    toks = _tokens(sql, ctx.dialect)
    spots = [toks[i - 1].end + 1 for i in range(1, len(toks))
             if toks[i].token_type is TokenType.FROM and toks[i - 1].token_type
             not in (TokenType.COMMA, TokenType.L_PAREN, TokenType.SELECT, TokenType.DISTINCT)]
    if isinstance(ctx.expr, exp.Select) and ctx.expr.args.get("order") \
            and not ctx.expr.args.get("limit"):
        spots.append(len(sql))  # ORDER BY a, b,  <end>
    pos = _pick(ctx.rng, spots)
    if pos is None:
        return None
    return sql[:pos] + "," + sql[pos:], f"trailing comma inserted at offset {pos}", None


# ----------------------------------------------------------------------------------------------
# Injectors: a construct from the wrong dialect


@dataclass(frozen=True)
class DialectRule:
    """Rewrite one construct into another dialect's spelling. ``apply`` returns the buggy SQL and
    a description, or None when the query has no such construct."""

    name: str
    origin: str  # sqlglot dialect the foreign construct belongs to (the issue SQL parses there)
    apply: Callable[[_Ctx], "tuple[str, str] | None"]


def _limit_to_top(ctx: _Ctx) -> tuple[str, str] | None:
    """``SELECT … LIMIT n`` (the query or a subquery) written as T-SQL ``SELECT TOP n …``."""
    sels = [s for s in ctx.expr.find_all(exp.Select) if isinstance(s.args.get("limit"), exp.Limit)
            and isinstance(s.args["limit"].expression, exp.Literal) and not s.args.get("offset")]
    sel = _pick(ctx.rng, sels)
    if sel is None:
        return None
    n = sel.args["limit"].expression.this
    sel.set("limit", None)
    text = sel.sql(dialect=ctx.dialect)
    head = "SELECT DISTINCT " if sel.args.get("distinct") else "SELECT "
    if not text.startswith(head):
        return None
    text = head + f"TOP {n} " + text[len(head):]
    sql = text if sel is ctx.expr else _splice(ctx, {0: (sel, text)})
    return sql, f"LIMIT {n} written as T-SQL TOP {n}"


def _top_to_limit(ctx: _Ctx) -> tuple[str, str] | None:
    sel = _top_select(ctx.expr)
    limit = sel.args.get("limit") if sel is not None else None
    if limit is None or not isinstance(limit, exp.Limit):
        return None
    n = limit.expression.sql()
    sel.set("limit", None)
    return ctx.render() + f" LIMIT {n}", f"TOP {n} written as LIMIT {n}"


def _func_rule(match: Callable[[exp.Expression], bool], make: Callable[[exp.Expression, _Ctx], str],
               what: str) -> Callable[[_Ctx], "tuple[str, str] | None"]:
    def apply(ctx: _Ctx) -> tuple[str, str] | None:
        nodes = [n for n in ctx.expr.walk() if match(n)]
        node = _pick(ctx.rng, nodes)
        if node is None:
            return None
        before = node.sql(dialect=ctx.dialect)
        text = make(node, ctx)
        return _splice(ctx, {0: (node, text)}), f"{what}: {before} written as {text}"
    return apply


def _args(node: exp.Expression, ctx: _Ctx) -> list[str]:
    return [a.sql(dialect=ctx.dialect) for a in [node.this, *node.expressions] if a is not None]


def _is_two_arg_coalesce(n: exp.Expression) -> bool:
    return isinstance(n, exp.Coalesce) and len(n.expressions) == 1


def _like_to_ilike(ctx: _Ctx) -> tuple[str, str] | None:
    nodes = list(ctx.expr.find_all(exp.Like))
    node = _pick(ctx.rng, nodes)
    if node is None:
        return None
    text = f"{node.this.sql(dialect=ctx.dialect)} ILIKE {node.expression.sql(dialect=ctx.dialect)}"
    return _splice(ctx, {0: (node, text)}), "LIKE written as PostgreSQL ILIKE"


def _quote_column(q: str, what: str) -> Callable[[_Ctx], "tuple[str, str] | None"]:
    def apply(ctx: _Ctx) -> tuple[str, str] | None:
        cols = [c for c in _columns(ctx.expr) if not _in_join_condition(c)]
        c = _pick(ctx.rng, cols)
        if c is None:
            return None
        text = (f"{c.table}." if c.table else "") + f"{q[0]}{c.name}{q[-1]}"
        return _splice(ctx, {0: (c, text)}), f"column {c.name} quoted with {what}"
    return apply


_DIALECT_RULES_LIST: dict[str, list[DialectRule]] = {
    "sqlite": [
        DialectRule("limit_as_top", "tsql", _limit_to_top),
        DialectRule("like_as_ilike", "postgres", _like_to_ilike),
        DialectRule("ifnull_as_isnull", "tsql", _func_rule(
            _is_two_arg_coalesce, lambda n, c: f"ISNULL({', '.join(_args(n, c))})", "T-SQL ISNULL")),
        DialectRule("length_as_len", "tsql", _func_rule(
            lambda n: isinstance(n, exp.Length), lambda n, c: f"LEN({n.this.sql(dialect=c.dialect)})",
            "T-SQL LEN")),
        DialectRule("cast_as_colons", "postgres", _func_rule(
            lambda n: isinstance(n, exp.Cast),
            lambda n, c: f"{n.this.sql(dialect=c.dialect)}::{n.to.sql(dialect='postgres')}",
            "PostgreSQL :: cast")),
        DialectRule("strftime_as_date_format", "mysql", _func_rule(
            lambda n: isinstance(n, exp.TimeToStr), lambda n, c: n.sql(dialect="mysql"),
            "MySQL DATE_FORMAT")),
        DialectRule("now", "mysql", _func_rule(
            lambda n: isinstance(n, (exp.CurrentTimestamp, exp.CurrentDate))
            or (isinstance(n, exp.Date) and n.this is not None and n.this.name.lower() == "now"),
            lambda n, c: "NOW()", "MySQL NOW()")),
        DialectRule("julianday_diff_as_datediff", "mysql", _func_rule(
            lambda n: isinstance(n, exp.Sub) and all(
                isinstance(s, exp.Anonymous) and s.name.lower() == "julianday"
                for s in (n.this, n.expression)),
            lambda n, c: f"DATEDIFF({n.this.expressions[0].sql(dialect=c.dialect)}, "
                         f"{n.expression.expressions[0].sql(dialect=c.dialect)})", "MySQL DATEDIFF")),
        DialectRule("pipes_as_concat", "mysql", _func_rule(
            lambda n: isinstance(n, exp.DPipe) and _sqlite_lacks_concat(),
            lambda n, c: f"CONCAT({n.this.sql(dialect=c.dialect)}, "
                         f"{n.expression.sql(dialect=c.dialect)})", "MySQL CONCAT")),
    ],
    "postgres": [
        DialectRule("coalesce_as_ifnull", "mysql", _func_rule(
            _is_two_arg_coalesce, lambda n, c: f"IFNULL({', '.join(_args(n, c))})", "MySQL IFNULL")),
        DialectRule("backtick_identifier", "mysql", _quote_column("``", "MySQL backticks")),
        DialectRule("limit_as_top", "tsql", _limit_to_top),
        DialectRule("length_as_len", "tsql", _func_rule(
            lambda n: isinstance(n, exp.Length), lambda n, c: f"LEN({n.this.sql(dialect=c.dialect)})",
            "T-SQL LEN")),
        DialectRule("pipes_as_plus", "tsql", _func_rule(
            lambda n: isinstance(n, exp.DPipe),
            lambda n, c: f"{n.this.sql(dialect=c.dialect)} + {n.expression.sql(dialect=c.dialect)}",
            "T-SQL + concatenation")),
    ],
    "mysql": [
        DialectRule("cast_as_colons", "postgres", _func_rule(
            lambda n: isinstance(n, exp.Cast),
            lambda n, c: f"{n.this.sql(dialect=c.dialect)}::{n.to.sql(dialect='postgres')}",
            "PostgreSQL :: cast")),
        DialectRule("like_as_ilike", "postgres", _like_to_ilike),
        DialectRule("limit_as_top", "tsql", _limit_to_top),
        DialectRule("concat_as_pipes", "postgres", _func_rule(
            lambda n: isinstance(n, exp.Concat) and len(n.expressions) == 2,
            lambda n, c: " || ".join(a.sql(dialect=c.dialect) for a in n.expressions),
            "PostgreSQL || concatenation")),
        DialectRule("double_quoted_identifier", "postgres", _quote_column('""', "double quotes")),
    ],
    "tsql": [
        DialectRule("top_as_limit", "sqlite", _top_to_limit),
        DialectRule("isnull_as_ifnull", "mysql", _func_rule(
            _is_two_arg_coalesce, lambda n, c: f"IFNULL({', '.join(_args(n, c))})", "MySQL IFNULL")),
        DialectRule("len_as_length", "sqlite", _func_rule(
            lambda n: isinstance(n, exp.Length), lambda n, c: f"LENGTH({n.this.sql(dialect=c.dialect)})",
            "LENGTH")),
    ],
    "oracle": [
        DialectRule("nvl_as_ifnull", "mysql", _func_rule(
            _is_two_arg_coalesce, lambda n, c: f"IFNULL({', '.join(_args(n, c))})", "MySQL IFNULL")),
        DialectRule("length_as_len", "tsql", _func_rule(
            lambda n: isinstance(n, exp.Length), lambda n, c: f"LEN({n.this.sql(dialect=c.dialect)})",
            "T-SQL LEN")),
    ],
}
# sqlglot dialect -> rule name -> rule (the registry the wrong_dialect injector draws from)
DIALECT_RULES: dict[str, dict[str, DialectRule]] = {
    d: {r.name: r for r in rules} for d, rules in _DIALECT_RULES_LIST.items()}


def _sqlite_lacks_concat() -> bool:
    import sqlite3
    return sqlite3.sqlite_version_info < (3, 44, 0)  # concat() arrived in SQLite 3.44


@_register("wrong_dialect", "wrong_dialect", "The query is rejected by the database.")
def _wrong_dialect(ctx: _Ctx) -> _Change | None:
    rules = list(DIALECT_RULES.get(ctx.dialect, {}).values())
    ctx.rng.shuffle(rules)
    pristine = ctx.expr
    for rule in rules:
        ctx.expr = pristine.copy()
        out = rule.apply(ctx)
        if out is not None:
            sql, desc = out
            return sql, f"[{rule.name}] {desc}", rule.origin
    return None


def applicable(expr: exp.Expression, schema: SchemaInfo, rng: random.Random,
               names: Iterable[str] | None = None) -> dict[str, Mutation]:
    """Every named injector's mutation of ``expr`` (those that apply), for inspection/tests."""
    out = {}
    for name in names or BUGS:
        m = BUGS[name].inject(expr, schema, rng)
        if m is not None:
            out[name] = m
    return out
