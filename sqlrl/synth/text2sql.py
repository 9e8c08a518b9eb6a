"""Text-to-SQL tasks generated from a domain's annotations, each gold query verified by execution.

    tasks = generate_text2sql("library", "/data/library.sqlite", n=200, seed=0)

Templates (``TEMPLATES``, a registry name -> (difficulty, function)) read only the annotations —
table nouns, column phrases and roles, foreign keys — never per-domain SQL:
- simple: projection + one filter (=, <, >, <=, >=, BETWEEN, LIKE, IS [NOT] NULL), COUNT, MIN/MAX,
  ORDER BY + LIMIT;
- moderate: joins over foreign keys, GROUP BY + aggregates, HAVING, DISTINCT, COUNT(DISTINCT);
- challenging: IN / NOT IN subqueries, comparison to a scalar AVG subquery, UNION / INTERSECT /
  EXCEPT, window functions (RANK / DENSE_RANK / ROW_NUMBER, partitioned), CTEs.

The parts live in two modules whose names are imported back here: ``text2sql_filters.py`` (the
draft and condition types, SQL and text helpers, ``Ctx``, the filter registry) and
``text2sql_templates.py`` (the templates and ``TEMPLATES``); this module verifies and generates.

Guarantees:
- Filter constants are sampled from the database itself. Every gold query was run through a
  ``sqlrl.db`` session on ``db_path``: it succeeded, returned between 1 and ``max_rows`` rows, and not
  a degenerate single 0/NULL. ``LIMIT`` is only used after ORDER BY with the primary key as the last
  sort key, and only when the row at the cut differs in the sort value from the next row (so the
  answer does not depend on tie-breaking the question does not mention). ``ROW_NUMBER`` is only used
  over values without ties.
- Gold SQL is unique within one call (compared after collapsing whitespace).
- The same ``(domain, database, n, seed, difficulties)`` gives the same tasks in the same order.
- ``task_id`` is ``synth/<domain>/<i>``, ``source`` is ``synthetic/<domain>``, ``db_id`` the domain
  name; ``meta`` holds ``template``, ``constructs`` and ``order_matters``; ``evidence`` states any
  value encoding the question relies on (BIRD style: "cancelled refers to status = 2").
- Bad arguments (negative ``n``, unknown difficulty or domain, missing database) raise ``ValueError``.
  When fewer than ``n`` distinct verified tasks can be found within the attempt budget, the tasks
  found are returned (never padded with duplicates); ``generate_text2sql(..., strict=True)`` raises.
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

from ..db import Limits, open_session
from ..tasks.types import DIFFICULTIES, Text2SQLTask, norm_difficulty
from .domains import Domain, get_domain
from .text2sql_filters import (  # noqa: F401  (the parts' names, importable from here as before)
    _WORD, CONDITION_BUILDERS, Cond, Ctx, Draft, Link, _cond_category, _cond_date, _cond_measure,
    _cond_text, encoding, join_evidence, lit, make_cond, ref, show)
from .text2sql_templates import (  # noqa: F401
    AGGS, SET_OPS, TEMPLATES, Template, _category_and_measure, _category_tables, _cte_per_parent,
    _one_filter, _parent_slots, _per_parent_cte, aggregates, label_slots, nouns, order_keys,
    t_above_avg, t_count_distinct, t_count_filter, t_cte_above_avg, t_cte_max_group, t_distinct,
    t_extreme, t_filter_list, t_group_agg, t_group_count, t_group_having, t_in_subquery,
    t_join_filter, t_join_group_agg, t_join_having, t_not_in_subquery, t_rank_list, t_set_op,
    t_top_k, t_top_per_group)

MAX_ROWS = 100


class GenerationError(ValueError):
    """Generation could not meet a strict request (e.g. fewer verified tasks than asked)."""


# --- verification and the generator ------------------------------------------------------------------

def verify(session: Any, draft: Draft, max_rows: int = MAX_ROWS) -> str | None:
    """None when ``draft`` is a usable gold query, else why not."""
    r = session.execute(draft.sql)
    if not r.ok:
        return f"error: {r.error}"
    if r.row_count == 0:
        return "empty result"
    if r.truncated or r.row_count > max_rows:
        return "result too large"
    if r.row_count == 1 and all(v is None or v == 0 for v in r.rows[0]):
        return "degenerate result (a single 0/NULL row)"
    if draft.cut is not None:
        probe, k, i = draft.cut
        p = session.execute(probe)
        if not p.ok or p.row_count <= k:
            return "LIMIT does not cut the result"
        if p.rows[k - 1][i] == p.rows[k][i]:
            return "tie at the LIMIT cut"
    return None


def _norm(sql: str) -> str:
    return " ".join(sql.split())


def generate_text2sql(domain: Domain | str, db_path: str, n: int, seed: int = 0,
                      difficulties: Sequence[str] = DIFFICULTIES, *, max_rows: int = MAX_ROWS,
                      attempts_per_task: int = 30, strict: bool = False) -> list[Text2SQLTask]:
    """``n`` verified text-to-SQL tasks over ``db_path`` (a database built for ``domain``), spread
    evenly over ``difficulties`` and round-robin over each difficulty's templates."""
    dom = get_domain(domain) if isinstance(domain, str) else domain
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if not difficulties:
        raise ValueError("difficulties must name at least one difficulty")
    levels = [norm_difficulty(d) for d in difficulties]
    if not os.path.isfile(db_path):
        raise ValueError(f"database file not found: {db_path}")
    rng = random.Random(f"text2sql:{dom.name}:{seed}")
    quotas = {lvl: n // len(levels) + (i < n % len(levels)) for i, lvl in enumerate(levels)}
    found: dict[str, list[tuple[Draft, str]]] = {lvl: [] for lvl in levels}
    seen: set[str] = set()
    url = "sqlite:///" + os.path.abspath(db_path)
    with open_session(url, limits=Limits(timeout_s=10, max_rows=max_rows + 1)) as session:
        ctx = Ctx(dom, session, rng)
        for lvl in levels:
            names = [name for name, (d, _) in TEMPLATES.items() if d == lvl]
            rng.shuffle(names)
            attempts = 0
            while len(found[lvl]) < quotas[lvl] and attempts < attempts_per_task * max(quotas[lvl], 1):
                name = names[attempts % len(names)]
                attempts += 1
                draft = TEMPLATES[name][1](ctx)
                if draft is None or _norm(draft.sql) in seen or verify(session, draft, max_rows):
                    continue
                seen.add(_norm(draft.sql))
                found[lvl].append((draft, lvl))
    if strict and sum(map(len, found.values())) < n:
        raise GenerationError(f"only {sum(map(len, found.values()))} of {n} tasks could be generated "
                              f"for domain {dom.name!r}")
    ordered = [found[lvl][i] for i in range(max(map(len, found.values()), default=0))
               for lvl in levels if i < len(found[lvl])]
    return [Text2SQLTask(task_id=f"synth/{dom.name}/{i}", db_id=dom.name, question=d.question,
                         gold_sql=d.sql, evidence=d.evidence, difficulty=lvl, source=f"synthetic/{dom.name}",
                         meta={"template": d.template, "constructs": list(d.constructs),
                               "order_matters": d.order_matters})
            for i, (d, lvl) in enumerate(ordered)]
