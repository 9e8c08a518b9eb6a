"""Execution-match comparators of the official Spider and BIRD evaluators, as pure functions.

Rows are sequences of tuples of ``None/bool/int/float/str`` (what ``sqlrl.db`` returns).

Guarantees:
- ``bird_ex(pred, gold)`` is BIRD ``evaluation_ex.py``'s ``calculate_ex``: ``set(pred) == set(gold)``
  (duplicates, row order and the order of rows' values inside a set do not matter; column order
  does; ``1 == 1.0`` as in Python).
- ``spider_ex(pred, gold, order_matters)`` is the test-suite evaluator's ``result_eq(gold, pred)``
  (``taoyds/test-suite-sql-eval``, ``exec_eval.py``), quirks included:
  two empty results match; results of different lengths or column counts never match; a quick
  rejection compares rows whose values were sorted by ``str(v) + str(type(v))`` (as a list when
  order matters, as a *set* otherwise), which is why ``(1, 1001)`` vs ``(1.0, 1001)`` fails while
  ``5`` vs ``5.0`` passes; then some permutation of the prediction's columns must make the two
  results equal as lists (order matters) or as multisets (bags). No float tolerance.
  The search over column permutations is pruned by per-column value multisets, a necessary
  condition of a match, so the verdict is that of the official (randomly pruned) enumeration.
- ``spider_prepare(sql)`` is what the test-suite evaluator runs instead of the query text
  (``postprocess``, ``remove_distinct`` with ``keep_distinct=False`` -- which, through sqlparse,
  keeps only the first ``;``-separated statement -- and ``replace_cur_year``);
  ``spider_order_matters(gold)`` is its substring test for ``order by`` in the prepared gold.
- ``spider_clean_pred(line)`` is what ``evaluation.py`` does to a prediction line before that:
  strip, cut at the first TAB, replace the substring ``value`` with ``1``.

And sqlrl's own engine-neutral equality (used where no official evaluator applies: checking a
translated task against SQLite, self-consistency votes): ``canonical_value`` (bools are ints,
floats rounded to 9 significant digits and integral ones made ints, text spelling a canonical
integer is that integer — the loader stores such columns as integers), ``same_result`` (bags, or
sequences when ordered) and ``outer_order_by(sql)`` (the outermost query has ORDER BY; parsed with
sqlglot, cached).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from itertools import chain
from typing import Any, Iterator, Sequence

from sqlparse.engine import FilterStack

Row = tuple[Any, ...]

__all__ = ["bird_ex", "canonical_value", "outer_order_by", "same_result", "spider_clean_pred",
           "spider_ex", "spider_order_matters", "spider_prepare", "unorder_row"]


# -- BIRD ----------------------------------------------------------------------------------------

def bird_ex(pred_rows: Sequence[Row], gold_rows: Sequence[Row]) -> bool:
    """BIRD execution accuracy for one pair: the two results are equal as sets of rows."""
    return set(map(tuple, pred_rows)) == set(map(tuple, gold_rows))


# -- Spider test-suite ---------------------------------------------------------------------------

_TYPE_NAMES = {t: str(t) for t in (type(None), bool, int, float, str, bytes)}


def _sort_key(value: Any) -> str:
    t = type(value)
    return str(value) + (_TYPE_NAMES.get(t) or str(t))


def unorder_row(row: Row) -> Row:
    """A row's values sorted by ``str(v) + str(type(v))`` (the official quick-reject key)."""
    return tuple(row) if len(row) < 2 else tuple(sorted(row, key=_sort_key))


def _quick_match(gold: list[Row], pred: list[Row], order_matters: bool) -> bool:
    g = [unorder_row(r) for r in gold]
    p = [unorder_row(r) for r in pred]
    return g == p if order_matters else set(g) == set(p)


def _column_permutations(gold: list[Row], pred: list[Row], ncols: int) -> Iterator[tuple[int, ...]]:
    """Permutations ``perm`` (gold column i <- pred column perm[i]) whose columns hold the same
    multiset of values: every permutation that can make the results equal, and maybe others."""
    gold_cols = [Counter(r[i] for r in gold) for i in range(ncols)]
    pred_cols = [Counter(r[j] for r in pred) for j in range(ncols)]
    candidates = [[j for j in range(ncols) if pred_cols[j] == gold_cols[i]] for i in range(ncols)]
    if any(not c for c in candidates):
        return
    perm: list[int] = []
    used = [False] * ncols

    def extend(i: int) -> Iterator[tuple[int, ...]]:
        if i == ncols:
            yield tuple(perm)
            return
        for j in candidates[i]:
            if not used[j]:
                used[j] = True
                perm.append(j)
                yield from extend(i + 1)
                perm.pop()
                used[j] = False

    yield from extend(0)


def _types(rows: list[Row]) -> list[type]:
    return list(map(type, chain.from_iterable(rows)))


def spider_ex(pred_rows: Sequence[Row], gold_rows: Sequence[Row], order_matters: bool) -> bool:
    """Spider test-suite execution match for one pair (``result_eq(gold, pred, order_matters)``)."""
    gold, pred = [tuple(r) for r in gold_rows], [tuple(r) for r in pred_rows]
    if not gold and not pred:
        return True
    if len(gold) != len(pred):
        return False
    ncols = len(gold[0])
    if len(pred[0]) != ncols:
        return False
    if gold == pred and _types(gold) == _types(pred):
        return True  # identical values of identical types: every check below passes
    if not _quick_match(gold, pred, order_matters):
        return False
    if ncols == 1:
        return gold == pred if order_matters else Counter(gold) == Counter(pred)
    gold_bag = None if order_matters else Counter(gold)
    for perm in _column_permutations(gold, pred, ncols):
        permuted = [tuple(r[j] for j in perm) for r in pred]
        if order_matters:
            if permuted == gold:
                return True
        elif Counter(permuted) == gold_bag:
            return True
    return False


# -- the SQL text the test-suite evaluator executes ----------------------------------------------

_CUR_YEAR_RE = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def _first_statement_tokens(sql: str) -> list[str]:
    """The leaf token texts of sqlparse's first statement of ``sql`` (``sqlparse.parse(sql)[0]
    .flatten()``: grouping never changes the leaves, so it is skipped)."""
    for statement in FilterStack().run(sql):
        return [t.value for t in statement.flatten()]
    raise ValueError("no SQL statement in the text (it is empty)")


_WORDS_WITH_DISTINCT = re.compile(r"[\w$]*distinct[\w$]*", re.IGNORECASE)
_DISTINCT_WORD = re.compile(r"(?<![\w$])distinct(?![\w$])", re.IGNORECASE)
_LEXICAL_HAZARDS = ("`", "[", "--", "/*", "#", ";", "GO", "\\")
_SIMPLE_LITERAL = re.compile(r"'[^'\\]*'|\"[^\"\\]*\"")


def remove_distinct(sql: str) -> str:
    """Drop every ``DISTINCT`` token; only the first statement survives (sqlparse's split, which
    ends a statement at a top-level ``;`` and also after an upper-case ``GO`` keyword).

    Fast paths, exact by construction: text without DISTINCT that is one statement is returned
    as is; outside simple string literals (no backslashes), text with no backticks, brackets,
    comments, ``;`` or ``GO`` is one statement whose every standalone word ``distinct`` is a
    DISTINCT token for sqlparse too, so removing those words gives the same text (tests/unit/test_compare.py checks it against sqlparse on every Spider
    query). Anything else goes through sqlparse (~1 ms a query)."""
    if "GO" not in sql and "distinct" not in sql.lower() and sql.strip():
        semi = sql.find(";")
        if semi < 0 or (semi == sql.rfind(";") and not sql[semi + 1:].strip(" \t")):
            # one statement (a lone ';' followed by spaces at most ends it either way) and nothing
            # to drop: sqlparse's tokens join back to the text
            return sql
    # string literals ('…', "…" without backslashes) are single sqlparse tokens: blank them out
    # (same length) and look for hazards and DISTINCT words only outside them
    outside = _SIMPLE_LITERAL.sub(lambda m: " " * len(m.group()), sql)
    if (sql.strip() and "'" not in outside and '"' not in outside
            and not any(h in outside for h in _LEXICAL_HAZARDS)
            and all(w.lower() == "distinct" for w in _WORDS_WITH_DISTINCT.findall(outside))):
        spans = [m.span() for m in _DISTINCT_WORD.finditer(outside)]
        keep, last = [], 0
        for start, end in spans:
            keep.append(sql[last:start])
            last = end
        return "".join(keep) + sql[last:]
    return remove_distinct_sqlparse(sql)


def remove_distinct_sqlparse(sql: str) -> str:
    """``remove_distinct`` exactly as the official evaluator computes it (sqlparse tokens)."""
    return "".join(t for t in _first_statement_tokens(sql) if t.lower() != "distinct")


@lru_cache(maxsize=65536)
def spider_prepare(sql: str, keep_distinct: bool = False) -> str:
    """The query the test-suite evaluator executes for ``sql`` (gold or cleaned prediction).

    Raises ``ValueError`` for text with no statement (the official evaluator would crash)."""
    sql = sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")
    if not keep_distinct:
        sql = remove_distinct(sql)
    elif not sql.strip():
        raise ValueError("no SQL statement in the text (it is empty)")
    return _CUR_YEAR_RE.sub("2020", sql)


def spider_order_matters(gold_sql: str, keep_distinct: bool = False) -> bool:
    """True when the (prepared) gold query contains ``order by`` -- a plain substring test, so a
    subquery's ORDER BY counts and ``ORDER  BY`` (two spaces) does not."""
    return "order by" in spider_prepare(gold_sql, keep_distinct).lower()


def spider_clean_pred(line: str) -> str:
    """What ``evaluation.py`` makes of a prediction line: stripped, cut at its first TAB, and with
    every ``value`` replaced by ``1``."""
    return line.strip().split("\t")[0].replace("value", "1")


# -- sqlrl's engine-neutral result equality ---------------------------------------------------------

_INT_TEXT = re.compile(r"-?(0|[1-9]\d{0,17})\Z")


def canonical_value(v: Any) -> Any:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return repr(v)
        v = float(f"{v:.9g}")
        return int(v) if v.is_integer() else v
    if isinstance(v, str) and _INT_TEXT.match(v):
        return int(v)
    return v


def canonical_rows(rows: Sequence[Row]) -> list[Row]:
    return [tuple(canonical_value(v) for v in row) for row in rows]


def same_result(a: Sequence[Row], b: Sequence[Row], ordered: bool) -> bool:
    ca, cb = canonical_rows(a), canonical_rows(b)
    return ca == cb if ordered else Counter(ca) == Counter(cb)


@lru_cache(maxsize=65536)
def outer_order_by(sql: str, dialect: str = "sqlite") -> bool:
    """True when the outermost query of ``sql`` has ORDER BY (row order is part of the answer);
    a subquery's ORDER BY does not count. Unparseable text falls back to a substring test.
    ``dialect``: a sqlrl dialect name or alias, or a sqlglot dialect name."""
    import sqlglot

    from sqlrl.db.dialects.descriptor import sqlglot_name

    try:
        tree = sqlglot.parse_one(sql, read=sqlglot_name(dialect))
        return tree is not None and tree.args.get("order") is not None
    except Exception:
        return "order by" in " ".join(sql.lower().split())
