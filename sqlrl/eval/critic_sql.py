"""BIRD-CRITIC's SQL-rewriting and result-comparison helpers, as the sandboxed test cases call them.

The sandbox child (``sqlrl.eval.sandbox_child``) puts these into a test case's namespace under
BIRD-CRITIC's names (``remove_comments``, ``remove_distinct``, ``remove_round``,
``preprocess_results``, ``check_sql_function_usage``) and ``ex_base`` compares with
``results_match``; ``sqlrl.eval.critic`` uses ``strip_sql`` and ``results_match`` in the parent.
Pure functions: no I/O, no database, no process state.

``strip_sql`` removes comments, query-level ``DISTINCT`` and ``ROUND(x, n)`` -> ``(x)`` by editing
the original text at the positions sqlglot's tokenizer reports, so string literals, quoted
identifiers and everything else stay byte-for-byte intact. Deliberate differences from
BIRD-CRITIC's text-based helpers (which split on spaces and use regexes): ``DISTINCT`` inside
aggregates (``COUNT(DISTINCT x)``) and ``DISTINCT ON (...)`` are kept (removing them changes the
values, not just multiplicity), and the unwrapped ROUND argument is parenthesised so
``ROUND(a+b, 2)*3`` stays ``(a+b)*3``. When the tokenizer cannot read the text (unterminated
string/quote) ``strip_sql_fallback`` applies BIRD-CRITIC's own text rules, which can change string
literals holding ``--``, ``/*``, ``ROUND(`` or `` distinct `` (tested); such SQL almost always fails
to execute anyway.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache
from typing import Any, Sequence

MAX_ROWS = 10_000  # BIRD-CRITIC caps every result at 10,000 rows

# --------------------------------------------------------------------------------------------
# SQL rewriting for the default test case (comments, DISTINCT, ROUND)
# --------------------------------------------------------------------------------------------

_GAP_COMMENT_RE = re.compile(r"--[^\n]*|#[^\n]*|/\*.*?\*/", re.S)


@lru_cache(maxsize=None)
def _tokenizer_dialect(name: str) -> Any:
    from sqlglot.dialects import Dialect

    return Dialect.get_or_raise(name)


def _tokens(sql: str, dialect: str) -> list[Any] | None:
    try:
        return list(_tokenizer_dialect(dialect).tokenize(sql))
    except Exception:  # sqlglot TokenError: unterminated string or quote
        return None


def _strip_comments_tokens(sql: str, tokens: list[Any]) -> str | None:
    """Rebuild ``sql`` from its tokens, replacing each gap that holds a comment by a space or
    newline. Gaps between tokens hold only white space and comments; if one holds anything else
    the tokenizer skipped text we do not understand, and ``None`` asks for the fallback."""
    out: list[str] = []
    pos = 0
    for tok in tokens + [None]:
        start = len(sql) if tok is None else tok.start
        gap = sql[pos:start]
        if gap:
            bare = _GAP_COMMENT_RE.sub(" ", gap)
            if bare.strip():
                return None
            out.append(gap if bare == gap else ("\n" if "\n" in gap else " "))
        if tok is not None:
            out.append(sql[tok.start:tok.end + 1])
            pos = tok.end + 1
    return "".join(out).strip()


def remove_comments_sql(sql: str, dialect: str = "sqlite") -> str:
    tokens = _tokens(sql, dialect)
    stripped = None if tokens is None else _strip_comments_tokens(sql, tokens)
    return _fallback_remove_comments(sql) if stripped is None else stripped


def remove_distinct_sql(sql: str, dialect: str = "sqlite") -> str:
    """Drop the query-level ``DISTINCT`` of every ``SELECT DISTINCT`` (not ``DISTINCT ON``, not
    ``COUNT(DISTINCT ...)``)."""
    from sqlglot.tokens import TokenType

    tokens = _tokens(sql, dialect)
    if tokens is None:
        return _fallback_remove_distinct(sql)
    cuts = []
    for i, tok in enumerate(tokens):
        if tok.token_type != TokenType.DISTINCT or i == 0:
            continue
        if tokens[i - 1].token_type != TokenType.SELECT:
            continue
        if i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.ON:
            continue
        end = tok.end + 1
        while end < len(sql) and sql[end] in " \t":
            end += 1
        cuts.append((tok.start, end))
    for start, end in reversed(cuts):
        sql = sql[:start] + sql[end:]
    return sql


def remove_round_sql(sql: str, dialect: str = "sqlite") -> str:
    """Replace every ``ROUND(x[, n])`` call by ``(x)``, innermost text edits one at a time."""
    from sqlglot.tokens import TokenType

    for _ in range(10_000):
        tokens = _tokens(sql, dialect)
        if tokens is None:
            return _fallback_remove_round(sql)
        call = None
        for i, tok in enumerate(tokens[:-1]):
            if (tok.token_type == TokenType.VAR and tok.text.upper() == "ROUND"
                    and tokens[i + 1].token_type == TokenType.L_PAREN):
                call = i
                break
        if call is None:
            return sql
        depth, arg_end, close = 0, None, None
        for j in range(call + 1, len(tokens)):
            kind = tokens[j].token_type
            if kind == TokenType.L_PAREN:
                depth += 1
            elif kind == TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    close = j
                    break
            elif kind == TokenType.COMMA and depth == 1 and arg_end is None:
                arg_end = j
        if close is None or close == call + 2:  # unbalanced, or ROUND(): leave it to the database
            return sql
        last = (arg_end if arg_end is not None else close) - 1
        arg = sql[tokens[call + 2].start:tokens[last].end + 1]
        sql = sql[:tokens[call].start] + "(" + arg + ")" + sql[tokens[close].end + 1:]
    return sql


def strip_sql(sql: str, dialect: str = "sqlite") -> str:
    """What the default test case runs instead of ``sql``: comments, DISTINCT, ROUND removed
    (in BIRD-CRITIC's order)."""
    return remove_round_sql(remove_distinct_sql(remove_comments_sql(sql, dialect), dialect), dialect)


def strip_sql_fallback(sql: str) -> str:
    """BIRD-CRITIC's own text rules, for text the tokenizer cannot read. Not literal-aware."""
    return _fallback_remove_round(_fallback_remove_distinct(_fallback_remove_comments(sql)))


def _fallback_remove_comments(sql: str) -> str:
    no_block = re.sub(r"/\*.*?\*/", "", sql, flags=re.DOTALL)
    no_line = re.sub(r"--.*?(\r\n|\r|\n|$)", r"\1", no_block)
    return re.sub(r"\n\s*\n+", "\n", no_line).strip()


def _fallback_remove_distinct(sql: str) -> str:
    return " ".join(t for t in sql.split(" ") if t.lower() != "distinct")


def _fallback_remove_round(sql: str) -> str:
    pattern = re.compile(r"ROUND\s*\(", re.IGNORECASE)
    for _ in range(10_000):
        m = pattern.search(sql)
        if m is None:
            break
        open_pos = m.end() - 1
        depth, arg_end, close = 0, None, None
        for k in range(open_pos, len(sql)):
            ch = sql[k]
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    close = k
                    break
            elif ch == "," and depth == 1 and arg_end is None:
                arg_end = k
        if close is None:
            break
        arg = sql[open_pos + 1:(arg_end if arg_end is not None else close)].strip()
        sql = sql[:m.start()] + "(" + arg + ")" + sql[close + 1:]
    return sql


# --------------------------------------------------------------------------------------------
# Result helpers (BIRD-CRITIC's preprocess_results / ex_base comparison)
# --------------------------------------------------------------------------------------------

def _round_value(item: Any, places: int) -> Any:
    if isinstance(item, bool):
        return item
    if isinstance(item, Decimal):
        return item.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    if isinstance(item, float):
        return round(item, places)
    if isinstance(item, (list, tuple)):
        return type(item)(_round_value(x, places) for x in item)
    if isinstance(item, dict):
        return {k: _round_value(v, places) for k, v in item.items()}
    return item


def preprocess_results(results: Any, decimal_places: int = 2) -> list[tuple[Any, ...]]:
    """BIRD-CRITIC's ``preprocess_results``: dates -> ``YYYY-MM-DD``, floats/Decimals rounded to
    ``decimal_places``, nested lists/dicts -> JSON text; every row a tuple."""
    processed = []
    for row in results or ():
        out = []
        for item in row:
            if isinstance(item, (date, datetime)):
                out.append(item.strftime("%Y-%m-%d"))
                continue
            item = _round_value(item, decimal_places)
            out.append(json.dumps(item, sort_keys=True) if isinstance(item, (dict, list)) else item)
        processed.append(tuple(out))
    return processed


def results_match(pred_rows: Any, sol_rows: Any, order: bool) -> bool:
    """The comparison inside BIRD-CRITIC's ``ex_base``: after ``preprocess_results``, an empty
    result on either side never matches; then list equality (``order``) or set equality."""
    pred, sol = preprocess_results(pred_rows), preprocess_results(sol_rows)
    if not pred or not sol:
        return False
    return pred == sol if order else set(pred) == set(sol)


def check_sql_function_usage(sqls: Sequence[str], required_keywords: Sequence[str]) -> int:
    if not sqls:
        return 0
    combined = " ".join(s.lower() for s in sqls)
    return int(all(kw.lower() in combined for kw in required_keywords))
