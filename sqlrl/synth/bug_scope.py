"""Helpers the bug injectors share: which table a column belongs to, renaming, splicing, picking.

``_alias_map`` / ``_scope_tables`` / ``_resolve`` tell which schema table a column of the query
belongs to; ``_set_column_name`` renames a column node (quoting a name that needs it);
``_columns`` and ``_in_join_condition`` find the columns a mutation may touch; ``_splice``
renders the query with some nodes replaced by raw text (constructs the dialect lacks); ``_pick``
is the one seeded choice every injector makes.

Guarantees:
- Read-only on the query except ``_set_column_name`` (renames the node it is given) and
  ``_splice`` (replaces the given nodes in ``ctx.expr``, a private copy, before rendering).
- ``_resolve`` answers ``None`` when the column's table is unknown or ambiguous, never a guess.
- ``_pick`` draws one ``rng.randrange`` per non-empty list and nothing for an empty one, so the
  injectors' seeded draws are what they were when these helpers lived in ``bugs.py``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from sqlglot import exp

from .bug_injector import _Ctx


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
