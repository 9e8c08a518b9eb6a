"""Bug injectors whose query is rejected: syntax errors and a construct from the wrong dialect.

Registered in this order: syntax_missing_comma, syntax_misspelled_keyword,
syntax_unbalanced_paren, syntax_trailing_comma (text-level edits of the rendered query), then
wrong_dialect, which draws from ``DIALECT_RULES`` (sqlglot dialect -> rule name -> ``DialectRule``),
a catalogue of foreign constructs keyed by sqlglot dialect: an engine without rules simply gets no
``wrong_dialect`` bugs.

Guarantees:
- Importing this module first imports ``bug_logic`` (so its injectors are registered before these
  whatever is imported first), then registers these five into ``bug_injector.BUGS`` in the order
  above: the registry's order, which decides what a seed produces, is the one it always was.
- The syntax family's SQL is one sqlglot rejects, and its ``parse_dialect`` is ``None`` (so is
  ``syntax_trailing_comma``'s: sqlglot accepts trailing commas, the engines do not, and
  ``critic_gen`` verifies it by execution); ``wrong_dialect``'s ``parse_dialect`` is the foreign
  dialect the construct comes from (``DialectRule.origin``).
- Runs no SQL (``_sqlite_lacks_concat`` reads the linked SQLite library's version only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from . import bug_logic  # noqa: F401  (registers the earlier injectors first: the registry's order)
from .bug_injector import _Change, _Ctx, _register
from .bug_scope import _columns, _in_join_condition, _pick, _splice, _top_select


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
