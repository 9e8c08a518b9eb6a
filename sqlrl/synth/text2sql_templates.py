"""The text-to-SQL templates and their registry ``TEMPLATES`` (name -> (difficulty, function)).

A template takes a ``Ctx`` (``text2sql_filters.py``) and returns a ``Draft`` (SQL, question,
constructs, evidence) or None when the domain offers nothing it can use; the generator in
``text2sql.py`` (which imports these names back) verifies each draft by execution.

Guarantees:
- ``TEMPLATES`` holds 20 templates in a fixed order (simple, then moderate, then challenging); the
  generator shuffles each difficulty's names with its seeded RNG, so this order is part of what a
  seed produces.
- Templates read only the domain's annotations (table nouns, column phrases and roles, foreign
  keys), never per-domain SQL, and draw every random choice from ``ctx.rng``.
- ``top_k`` orders by the primary key last and carries the LIMIT probe (``Draft.cut``);
  ``rank_list`` uses ROW_NUMBER only over values without ties (RANK otherwise).
"""

from __future__ import annotations

from typing import Callable

from .domains import Column, Table
from .phrasing import plural, question
from .text2sql_filters import (Ctx, Draft, Link, _cond_category, encoding, join_evidence, make_cond,
                               ref)


def label_slots(t: Table, prefix: str = "") -> dict[str, str]:
    label = t.column(t.label).phrase
    return {f"{prefix}label": label, f"{prefix}labels": plural(label)}


def nouns(t: Table) -> dict[str, str]:
    return {"thing": t.singular, "things": t.plural, **label_slots(t)}


def order_keys(t: Table, alias: str = "") -> str:
    return ", ".join(ref(alias, k) for k in t.primary_key)


def _one_filter(ctx: Ctx, name: str, select: Callable[[Table], str],
                constructs: tuple[str, ...]) -> Draft | None:
    """``SELECT <select(t)> FROM t WHERE <one sampled condition>``."""
    t = ctx.pick(ctx.domain.tables)
    cond = make_cond(ctx, t)
    if cond is None:
        return None
    sql = f"SELECT {select(t)} FROM {t.name} WHERE {cond.sql}"
    return Draft(name, sql, question(name, {**nouns(t), "cond": cond.phrase}, ctx.rng),
                 constructs, cond.evidence)


def t_filter_list(ctx: Ctx) -> Draft | None:
    return _one_filter(ctx, "filter_list", lambda t: t.label, ("projection", "filter"))


def t_count_filter(ctx: Ctx) -> Draft | None:
    return _one_filter(ctx, "count_filter", lambda t: "COUNT(*)", ("aggregate", "filter"))


def t_extreme(ctx: Ctx) -> Draft | None:
    tables = [t for t in ctx.domain.tables if t.by_role("measure", "date")]
    t = ctx.pick(tables)
    if t is None:
        return None
    m = ctx.pick(t.by_role("measure", "date"))
    fn = ctx.rng.choice(["MAX", "MIN"])
    ext = {("MAX", "measure"): "highest", ("MIN", "measure"): "lowest",
           ("MAX", "date"): "latest", ("MIN", "date"): "earliest"}[fn, m.role]
    cond, scope = None, ""
    if ctx.rng.random() < 0.5:
        cond = make_cond(ctx, t, roles=("category",), allow_null=False)
        scope = f" {cond.phrase}" if cond else ""
    where = f" WHERE {cond.sql}" if cond else ""
    sql = f"SELECT {fn}({m.name}) FROM {t.name}{where}"
    slots = {**nouns(t), "ext": ext, "measure": m.phrase, "scope": scope}
    return Draft("extreme", sql, question("extreme", slots, ctx.rng), ("aggregate",) + (("filter",) if cond else ()),
                 cond.evidence if cond else "")


def t_top_k(ctx: Ctx) -> Draft | None:
    t = ctx.pick([t for t in ctx.domain.tables if t.by_role("measure")])
    if t is None:
        return None
    m = ctx.pick(t.by_role("measure"))
    k = ctx.rng.choice([3, 5, 10])
    desc = ctx.rng.random() < 0.7
    where = f" WHERE {m.name} IS NOT NULL" if m.nullable else ""
    label = t.label if t.label != m.name else t.primary_key[0]
    base = (f"SELECT {label}, {m.name} FROM {t.name}{where} "
            f"ORDER BY {m.name} {'DESC' if desc else 'ASC'}, {order_keys(t)} LIMIT ")
    slots = {**nouns(t), "k": k, "measure": m.phrase, "ext": "highest" if desc else "lowest",
             "dir": "highest" if desc else "lowest"}
    return Draft("top_k", base + str(k), question("top_k", slots, ctx.rng), ("projection", "order-limit"),
                 order_matters=True, cut=(base + str(k + 1), k, 1))


def t_join_filter(ctx: Ctx) -> Draft | None:
    link = ctx.pick(ctx.links)
    if link is None:
        return None
    c, p = link.child, link.parent
    cond = make_cond(ctx, p, "T2", roles=("category", "measure", "date", "name"), prefix=f"{link.role}'s ")
    if cond is None:
        return None
    sql = (f"SELECT T1.{c.label}, T2.{p.label} FROM {c.name} AS T1 JOIN {p.name} AS T2 "
           f"ON T1.{link.fk.column} = T2.{link.fk.ref_column} WHERE {cond.sql}")
    slots = {**nouns(c), "cond": cond.phrase, "role": link.role, "plabel": p.column(p.label).phrase}
    return Draft("join_filter", sql, question("join_filter", slots, ctx.rng), ("join", "filter"), cond.evidence)


def _category_tables(ctx: Ctx) -> list[tuple[Table, Column]]:
    return [(t, c) for t in ctx.domain.tables for c in t.by_role("category")]


def t_group_count(ctx: Ctx) -> Draft | None:
    pair = ctx.pick(_category_tables(ctx))
    if pair is None:
        return None
    t, c = pair
    sql = f"SELECT {c.name}, COUNT(*) FROM {t.name} GROUP BY {c.name}"
    ev = join_evidence(*(encoding(c, code) for code, _ in c.codes))
    return Draft("group_count", sql, question("group_count", {**nouns(t), "col": c.phrase}, ctx.rng),
                 ("group-by", "aggregate"), ev)


AGGS = {"AVG": "average", "SUM": "total", "MAX": "maximum", "MIN": "minimum"}


def aggregates(m: Column) -> list[str]:
    return [fn for fn in AGGS if m.summable or fn not in ("SUM", "AVG")]


def t_group_agg(ctx: Ctx) -> Draft | None:
    picked = _category_and_measure(ctx)
    if picked is None:
        return None
    t, c, m = picked
    fn = ctx.rng.choice(aggregates(m))
    sql = f"SELECT {c.name}, {fn}({m.name}) FROM {t.name} GROUP BY {c.name}"
    slots = {**nouns(t), "col": c.phrase, "agg": AGGS[fn], "measure": m.phrase}
    return Draft("group_agg", sql, question("group_agg", slots, ctx.rng), ("group-by", "aggregate"))


def t_group_having(ctx: Ctx) -> Draft | None:
    pair = ctx.pick(_category_tables(ctx))
    if pair is None:
        return None
    t, c = pair
    counts = sorted(n for (n,) in ctx.rows(f"SELECT COUNT(*) FROM {t.name} GROUP BY {c.name}"))
    k = ctx.middle(counts)
    if k is None:
        return None
    sql = f"SELECT {c.name}, COUNT(*) FROM {t.name} GROUP BY {c.name} HAVING COUNT(*) > {k}"
    return Draft("group_having", sql, question("group_having", {**nouns(t), "col": c.phrase, "k": k}, ctx.rng),
                 ("group-by", "having", "aggregate"))


def _parent_slots(link: Link) -> dict[str, str]:
    p = link.parent
    return {**nouns(link.child), "parent": p.singular, "parents": p.plural, "role": link.role,
            **label_slots(p, "p")}


def t_join_having(ctx: Ctx) -> Draft | None:
    link = ctx.pick(ctx.links)
    if link is None:
        return None
    fk = link.fk
    counts = sorted(n for (n,) in ctx.rows(
        f"SELECT COUNT(*) FROM {fk.table} WHERE {fk.column} IS NOT NULL GROUP BY {fk.column}"))
    if len(counts) < 3:
        return None
    k = counts[ctx.rng.randrange(int(len(counts) * 0.8), len(counts))]
    p = link.parent
    sql = (f"SELECT T2.{p.label}, COUNT(*) FROM {fk.table} AS T1 JOIN {p.name} AS T2 "
           f"ON T1.{fk.column} = T2.{fk.ref_column} GROUP BY {order_keys(p, 'T2')}"
           f"{'' if p.label in p.primary_key else ', T2.' + p.label} HAVING COUNT(*) >= {k}")
    return Draft("join_having", sql, question("join_having", {**_parent_slots(link), "k": k}, ctx.rng),
                 ("join", "group-by", "having", "aggregate"))


def t_join_group_agg(ctx: Ctx) -> Draft | None:
    options = [(link, pc, m) for link in ctx.links for pc in link.parent.by_role("category")
               for m in link.child.by_role("measure")]
    choice = ctx.pick(options)
    if choice is None:
        return None
    link, pc, m = choice
    fk = link.fk
    fn = ctx.rng.choice(aggregates(m))
    sql = (f"SELECT T2.{pc.name}, {fn}(T1.{m.name}) FROM {fk.table} AS T1 JOIN {fk.ref_table} AS T2 "
           f"ON T1.{fk.column} = T2.{fk.ref_column} GROUP BY T2.{pc.name}")
    slots = {**_parent_slots(link), "agg": AGGS[fn], "measure": m.phrase, "pcol": pc.phrase}
    return Draft("join_group_agg", sql, question("join_group_agg", slots, ctx.rng),
                 ("join", "group-by", "aggregate"))


def t_distinct(ctx: Ctx) -> Draft | None:
    pair = ctx.pick(_category_tables(ctx))
    if pair is None:
        return None
    t, c = pair
    cond = make_cond(ctx, t, roles=("measure", "date", "name", "text"))
    if cond is None:
        return None
    sql = f"SELECT DISTINCT {c.name} FROM {t.name} WHERE {cond.sql}"
    ev = join_evidence(cond.evidence, *(encoding(c, code) for code, _ in c.codes))
    return Draft("distinct", sql, question("distinct", {**nouns(t), "col": c.phrase, "cond": cond.phrase}, ctx.rng),
                 ("distinct", "filter"), ev)


def t_count_distinct(ctx: Ctx) -> Draft | None:
    link = ctx.pick(ctx.links)
    if link is None:
        return None
    cond = make_cond(ctx, link.child, roles=("category", "measure", "date"))
    if cond is None:
        return None
    sql = f"SELECT COUNT(DISTINCT {link.fk.column}) FROM {link.fk.table} WHERE {cond.sql}"
    return Draft("count_distinct", sql, question("count_distinct", {**_parent_slots(link), "cond": cond.phrase},
                                                 ctx.rng), ("distinct", "aggregate", "filter"), cond.evidence)


def t_in_subquery(ctx: Ctx, negate: bool = False) -> Draft | None:
    link = ctx.pick(ctx.links)
    if link is None:
        return None
    fk, p = link.fk, link.parent
    cond = make_cond(ctx, link.child, roles=("category", "measure", "date"), allow_null=False)
    if cond is None:
        return None
    inner = f"SELECT {fk.column} FROM {fk.table} WHERE {fk.column} IS NOT NULL AND {cond.sql}"
    sql = f"SELECT {p.label} FROM {p.name} WHERE {fk.ref_column} {'NOT IN' if negate else 'IN'} ({inner})"
    name = "not_in_subquery" if negate else "in_subquery"
    return Draft(name, sql, question(name, {**_parent_slots(link), "cond": cond.phrase}, ctx.rng),
                 ("subquery", "filter"), cond.evidence)


def t_not_in_subquery(ctx: Ctx) -> Draft | None:
    return t_in_subquery(ctx, negate=True)


def _category_and_measure(ctx: Ctx) -> tuple[Table, Column, Column] | None:
    """A table with a category column and a measure column, and one of each (None when the
    domain has no such table)."""
    pair = ctx.pick([(t, c) for t, c in _category_tables(ctx) if t.by_role("measure")])
    if pair is None:
        return None
    t, c = pair
    return t, c, ctx.pick(t.by_role("measure"))


def t_above_avg(ctx: Ctx) -> Draft | None:
    picked = _category_and_measure(ctx)
    if picked is None:
        return None
    t, c, m = picked
    cond = _cond_category(ctx, t, c, c.name, c.phrase)
    if cond is None:
        return None
    sql = (f"SELECT {t.label}, {m.name} FROM {t.name} WHERE {cond.sql} AND {m.name} > "
           f"(SELECT AVG({m.name}) FROM {t.name} WHERE {cond.sql})")
    slots = {**nouns(t), "cond": cond.phrase, "measure": m.phrase}
    return Draft("above_avg", sql, question("above_avg", slots, ctx.rng), ("subquery", "aggregate", "filter"),
                 cond.evidence)


SET_OPS = {"INTERSECT": "{a} and also {b}", "UNION": "either {a} or {b}", "EXCEPT": "{a} but not {b}"}


def t_set_op(ctx: Ctx) -> Draft | None:
    t = ctx.pick([t for t in ctx.domain.tables if len(t.primary_key) == 1 and t.label != t.primary_key[0]])
    if t is None:
        return None
    a = make_cond(ctx, t, allow_null=False)
    b = make_cond(ctx, t, allow_null=False)
    if a is None or b is None or a.sql == b.sql:
        return None
    op = ctx.rng.choice(list(SET_OPS))
    pk = t.primary_key[0]
    sql = (f"SELECT {pk}, {t.label} FROM {t.name} WHERE {a.sql} {op} "
           f"SELECT {pk}, {t.label} FROM {t.name} WHERE {b.sql}")
    slots = {**nouns(t), "pk": t.column(pk).phrase, "setphrase": SET_OPS[op].format(a=a.phrase, b=b.phrase)}
    return Draft("set_op", sql, question("set_op", slots, ctx.rng), ("set-op", "filter"),
                 join_evidence(a.evidence, b.evidence))


def t_top_per_group(ctx: Ctx) -> Draft | None:
    picked = _category_and_measure(ctx)
    if picked is None:
        return None
    t, c, m = picked
    desc = ctx.rng.random() < 0.7
    sql = (f"WITH ranked AS (SELECT {c.name}, {t.label}, {m.name}, RANK() OVER (PARTITION BY {c.name} "
           f"ORDER BY {m.name} {'DESC' if desc else 'ASC'}) AS rnk FROM {t.name} "
           f"WHERE {c.name} IS NOT NULL AND {m.name} IS NOT NULL) "
           f"SELECT {c.name}, {t.label}, {m.name} FROM ranked WHERE rnk = 1")
    slots = {**nouns(t), "col": c.phrase, "measure": m.phrase, "ext": "highest" if desc else "lowest",
             "dir": "highest" if desc else "lowest"}
    ev = join_evidence(*(encoding(c, code) for code, _ in c.codes))
    return Draft("top_per_group", sql, question("top_per_group", slots, ctx.rng), ("window", "cte"), ev)


def t_rank_list(ctx: Ctx) -> Draft | None:
    picked = _category_and_measure(ctx)
    if picked is None:
        return None
    t, c, m = picked
    cond = _cond_category(ctx, t, c, c.name, c.phrase)
    if cond is None:
        return None
    desc = ctx.rng.random() < 0.7
    where = f"{cond.sql}{' AND ' + m.name + ' IS NOT NULL' if m.nullable else ''}"
    fn = ctx.rng.choice(["RANK", "DENSE_RANK", "ROW_NUMBER"])
    if fn == "ROW_NUMBER":  # only when the order is total, so the numbering is the question's answer
        total, distinct = ctx.rows(f"SELECT COUNT(*), COUNT(DISTINCT {m.name}) FROM {t.name} WHERE {where}")[0]
        if total != distinct:
            fn = "RANK"
    names = {"RANK": "rank", "DENSE_RANK": "dense rank (no gaps after ties)", "ROW_NUMBER": "position"}
    sql = (f"SELECT {t.label}, {m.name}, {fn}() OVER (ORDER BY {m.name} {'DESC' if desc else 'ASC'}) AS rnk "
           f"FROM {t.name} WHERE {where}")
    slots = {**nouns(t), "cond": cond.phrase, "measure": m.phrase, "dir": "highest" if desc else "lowest",
             "rankname": names[fn]}
    return Draft("rank_list", sql, question("rank_list", slots, ctx.rng), ("window", "filter"), cond.evidence)


def _per_parent_cte(link: Link) -> str:
    fk = link.fk
    return (f"WITH per AS (SELECT {fk.column} AS k, COUNT(*) AS n FROM {fk.table} "
            f"WHERE {fk.column} IS NOT NULL GROUP BY {fk.column}) ")


def _cte_per_parent(ctx: Ctx, name: str, condition: str) -> Draft | None:
    """Parents whose child count ``per.n`` satisfies ``condition`` (against the per-parent CTE)."""
    link = ctx.pick(ctx.links)
    if link is None:
        return None
    p = link.parent
    sql = (_per_parent_cte(link) + f"SELECT T2.{p.label}, per.n FROM per JOIN {p.name} AS T2 "
           f"ON T2.{link.fk.ref_column} = per.k WHERE per.n {condition}")
    return Draft(name, sql, question(name, _parent_slots(link), ctx.rng),
                 ("cte", "group-by", "join", "subquery", "aggregate"))


def t_cte_max_group(ctx: Ctx) -> Draft | None:
    return _cte_per_parent(ctx, "cte_max_group", "= (SELECT MAX(n) FROM per)")


def t_cte_above_avg(ctx: Ctx) -> Draft | None:
    return _cte_per_parent(ctx, "cte_above_avg", "> (SELECT AVG(n) FROM per)")


Template = Callable[[Ctx], "Draft | None"]
TEMPLATES: dict[str, tuple[str, Template]] = {
    "filter_list": ("simple", t_filter_list),
    "count_filter": ("simple", t_count_filter),
    "extreme": ("simple", t_extreme),
    "top_k": ("simple", t_top_k),
    "join_filter": ("moderate", t_join_filter),
    "group_count": ("moderate", t_group_count),
    "group_agg": ("moderate", t_group_agg),
    "group_having": ("moderate", t_group_having),
    "join_having": ("moderate", t_join_having),
    "join_group_agg": ("moderate", t_join_group_agg),
    "distinct": ("moderate", t_distinct),
    "count_distinct": ("moderate", t_count_distinct),
    "in_subquery": ("challenging", t_in_subquery),
    "not_in_subquery": ("challenging", t_not_in_subquery),
    "above_avg": ("challenging", t_above_avg),
    "set_op": ("challenging", t_set_op),
    "top_per_group": ("challenging", t_top_per_group),
    "rank_list": ("challenging", t_rank_list),
    "cte_max_group": ("challenging", t_cte_max_group),
    "cte_above_avg": ("challenging", t_cte_above_avg),
}
